"""A Triton Python model with a fixed service time, for the quality-of-service benchmark.

Never imported: :mod:`loadtest.qos` copies this file into a model repository as ``model.py``. Each
request holds its instance for ``service_ms`` (a config parameter) and echoes its input. A fixed
service time without CPU work keeps the measurement about scheduling (who waits in Triton's queue,
who is shed at the gateway) rather than about how busy the machine's cores happen to be.
"""

import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.service_s = float(parameters["service_ms"]["string_value"]) / 1000.0

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            time.sleep(self.service_s)
            responses.append(
                pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", value)])
            )
        return responses
