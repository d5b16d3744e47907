"""A Triton Python model that answers at once, for measuring the load generator's own capacity.

Never imported: :mod:`loadtest.loadgen.capacity` loads this file into a running Triton as the
``model.py`` of an *instant twin* of the model under test (same inputs, outputs, batching), so the
load generator can be driven, with the same requests, against a model that does no work. Each
request gets zeros shaped like the outputs its twin would return (the batch size taken from the
first input), so responses are as large as the real ones.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self._batched = int(config.get("max_batch_size", 0)) > 0
        self._first_input = config["input"][0]["name"]
        self._outputs = [
            (
                out["name"],
                pb_utils.triton_string_to_numpy(out["data_type"]),
                [max(int(d), 1) for d in out["dims"]],
            )
            for out in config["output"]
        ]

    def execute(self, requests):
        responses = []
        for request in requests:
            prefix = []
            if self._batched:
                prefix = [pb_utils.get_input_tensor_by_name(request, self._first_input).shape()[0]]
            tensors = []
            for name, dtype, dims in self._outputs:
                if dtype == np.object_:
                    value = np.full(prefix + dims, b"", dtype=np.object_)
                else:
                    value = np.zeros(prefix + dims, dtype=dtype)
                tensors.append(pb_utils.Tensor(name, value))
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
