"""Why Triton's Python models could not import diffusers' VAE (call 3): import transformers' generation
utilities in the numpy-1.26 interpreter the diffusion step gives Triton's Python models, and print
the traceback. Run from the repository root on the GPU host, after ``gpu_bench.sh``'s setup:

    PYTHONPATH=$PWD:/tmp/loadtest-site python3 loadtest/probes/diffusion_imports.py
"""

import subprocess
import tempfile
import zipfile
from pathlib import Path

from loadtest.bench.carried import numpy1_interpreter, one

work = Path(tempfile.mkdtemp())
site = work / "dsite"
zipfile.ZipFile(one(Path(".whl/diffusion"), "diffusers-*.zip")).extractall(site)
stub = numpy1_interpreter(Path(".whl/embeddings"), work, check="torch", also=[site])
code = (
    "import traceback\ntry:\n  import transformers.generation.utils\n"
    "except Exception:\n  traceback.print_exc()"
)
result = subprocess.run([str(stub), "-c", code], capture_output=True, text=True)
print("===== transformers.generation", result.returncode)
print(result.stdout[-300:])
print(result.stderr[:6000])
