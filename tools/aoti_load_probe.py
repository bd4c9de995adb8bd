# AOTInductor load probe (issue 9, run on the GPU image): does any AOTI package load in a fresh child process
# (aten-only; a triton op; CUDA initialised first)? On the H200 image (torch 2.11) even the aten-only package crashed
# on load (bench/NOTES.md), so a jfa_ops package could not be shown to run there.
import os, subprocess, sys, tempfile, torch, triton, triton.language as tl
d = tempfile.mkdtemp()

@triton.jit
def add_kernel(X, Y, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + i, tl.load(X + i, mask=i < n) + 1, mask=i < n)

@torch.library.triton_op("probe::add1", mutates_args=())
def add1(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    n = x.numel()
    torch.library.wrap_triton(add_kernel)[(triton.cdiv(n, 128),)](x, y, n, BLOCK=128)
    return y

class Aten(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2) + 1

class Tri(torch.nn.Module):
    def forward(self, x):
        return torch.ops.probe.add1(x * 2)

x = torch.randn(1000, device="cuda")
pk = {}
for name, m in (("aten", Aten()), ("tri", Tri())):
    prog = torch.export.export(m, (x,), dynamic_shapes=({0: torch.export.Dim("n", min=2)},))
    pk[name] = torch._inductor.aoti_compile_and_package(prog, package_path=os.path.join(d, f"{name}.pt2"))
env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
for name in pk:
    for init in ("", "torch.empty(1, device='cuda'); torch.cuda.synchronize(); "):
        child = ("import torch,sys; " + init + "m=torch._inductor.aoti_load_package(sys.argv[1]); print('loaded', flush=True); "
                 "x=torch.randn(777,device='cuda'); y=m(x); y=y[0] if isinstance(y,(list,tuple)) else y; print('ran', float((y-(x*2+1)).abs().max()) if y.shape==x.shape else y.shape)")
        r = subprocess.run([sys.executable, "-X", "faulthandler", "-c", child, pk[name]], capture_output=True, text=True, cwd="/tmp", env=env)
        print(f"{name:5s} init={'yes' if init else 'no '} rc={r.returncode} out={r.stdout.strip()[-200:]!r} err={r.stderr.strip().splitlines()[-1][-200:] if r.stderr.strip() else ''!r}", flush=True)
# same, in this process (the package loaded where it was built)
for name in pk:
    try:
        m = torch._inductor.aoti_load_package(pk[name]); y = m(x); print(name, "in-process ok", flush=True)
    except Exception as e:
        print(name, "in-process", type(e).__name__, str(e)[:300], flush=True)
