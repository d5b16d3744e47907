"""Helpers shared by the test folders (import as ``tests.support.<module>``).

- :mod:`tests.support.repository`: where the test model repository lives and what it holds.
- :mod:`tests.support.gateway_procs`: real gateway and redis-server subprocesses, API keys.
- :mod:`tests.support.api_errors`: error answers read in the shape of their API (KServe, OpenAI, problem).
- :mod:`tests.support.tiny_repo`: a Triton repository of tiny, fast Python models.
- :mod:`tests.support.variant_repos`: copying and hashing repository entries.
- :mod:`tests.support.k8s_render`: rendering the Kubernetes manifests and reading their documents.
- :mod:`tests.support.k8s_checks`, :mod:`tests.support.k8s_workload_checks`: invariant checks over them.
- :mod:`tests.support.triton_stats`: Triton's statistics, read once they have settled.
- :mod:`tests.support.reference`: the eager PyTorch outputs served artifacts must match.
- :mod:`tests.support.torchscript_entry`: requests to the TorchScript entry the pytorch backend serves.
- :mod:`tests.support.tensorrt`: the installed TensorRT flavour, or the engine test skipped with the reason.
- :mod:`tests.support.images`: real photographs and hostile or unusual image files, encoded in memory.
- :mod:`tests.support.hostile_corpus`: the hostile-input case types; the families in the other
  ``hostile_*`` modules, the harness that sends and watches in ``hostile_harness``.

Test data files live in ``tests/fixtures/``.
"""
