"""Does an AOTInductor package load on this GPU host? A tiny FP16 conv net, exported with a dynamic
batch axis, compiled with ``aoti_compile_and_package`` and loaded with ``aoti_load_package``, in a
child process per case (a segfault ends the case, not the probe).

    python3 -u loadtest/probes/aoti_load.py same     # load in the process that compiled
                                                     # (call 2 ran this case)
    python3 -u loadtest/probes/aoti_load.py fresh    # load in a new process (call 6)
"""

import os
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import faulthandler, os, subprocess, sys, time
import torch
faulthandler.enable()
m = torch.nn.Sequential(
    torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
    torch.nn.Linear(8, 4),
).cuda().half().eval()
x = torch.randn(4, 3, 32, 32, device="cuda", dtype=torch.half)
t = time.time()
with torch.no_grad():
    dynamic = ({0: torch.export.Dim("batch", min=1, max=64)},)
    ep = torch.export.export(m, (x,), dynamic_shapes=dynamic, strict=False)
pkg = torch._inductor.aoti_compile_and_package(ep, package_path=os.path.join(sys.argv[1], "m.pt2"))
print("compiled", round(time.time() - t, 1), "s", flush=True)
if sys.argv[2] == "fresh":
    print("loading in a fresh process", flush=True)
    load = ("import faulthandler, torch; faulthandler.enable(); c = torch._inductor.aoti_load_package(%r); "
            "print('fresh load ok', c(torch.randn(4, 3, 32, 32, device='cuda', dtype=torch.half)))" % pkg)
    print("fresh rc", subprocess.run([sys.executable, "-c", load]).returncode, flush=True)
else:
    print("same-process load ok", torch._inductor.aoti_load_package(pkg)(x), flush=True)
"""

for mode in sys.argv[1:] or ["same", "fresh"]:
    with tempfile.TemporaryDirectory() as tmp:
        started = time.time()
        try:
            r = subprocess.run(
                [sys.executable, "-c", CHILD, tmp, mode],
                env=os.environ,
                capture_output=True,
                text=True,
                timeout=150,
            )
        except subprocess.TimeoutExpired:
            print(f"=== {mode}: timed out")
            continue
        print(
            f"=== default opt, {mode} process: rc {r.returncode} in {time.time() - started:.0f} s"
        )
        print(r.stdout[-1500:])
        print(r.stderr[-2500:])
