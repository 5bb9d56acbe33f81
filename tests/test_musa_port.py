"""CUDA <-> MUSA translation (the project's own map) and the MUSA portability checker: no MUSA device needed."""

from collections import Counter

import pytest

from musacoder.examples_catalog import EXAMPLES_DIR
from musacoder.musa.portability import capabilities, check, check_cpp
from musacoder.musa.translate import C2M, M2C, pairs, translate, translate_cpp

CUDA_EXAMPLES = sorted((EXAMPLES_DIR / "cuda").glob("*.py"))


def test_map_has_no_identity_pairs_and_is_one_to_one_except_documented():
    ps = pairs()
    assert len(ps) > 150
    assert not [p for p in ps if p.cuda == p.musa]
    for side in ("cuda", "musa"):
        counts = Counter((p.kind == "python", getattr(p, side)) for p in ps)
        dup = {k for k, n in counts.items() if n > 1}
        many = {(p.kind == "python", p.musa) for p in ps if p.note.startswith("many-to-one")}
        assert dup <= (many if side == "musa" else set()), dup


@pytest.mark.parametrize("path", CUDA_EXAMPLES, ids=lambda p: p.stem)
def test_every_shipped_cuda_kernel_round_trips(path):
    src = path.read_text()
    musa = translate(src, C2M)
    assert musa.text != src and "cuda_sources" not in musa.text and "getCurrentCUDAStream" not in musa.text
    assert translate(musa.text, M2C).text == src
    assert translate(musa.text, C2M).text == musa.text  # idempotent: MUSA names are not CUDA keys


def test_golden_cpp_pairs_and_what_stays_alone():
    src = ('#include <cuda_runtime.h>\n#include <ATen/cuda/CUDAContext.h>\n'
           '// cudaMalloc in a comment stays\n'
           '__global__ void relu_cuda(const __nv_bfloat16* x) { my_cudaMalloc(); }\n'
           'void f(torch::Tensor t) { TORCH_CHECK(t.is_cuda(), "needs cudaMalloc"); cudaStream_t s = '
           'at::cuda::getCurrentCUDAStream(); c10::cuda::CUDAGuard g(t.device()); cudaMalloc(0, 0); }\n')
    out = translate_cpp(src, C2M)
    assert "#include <musa_runtime.h>" in out and "#include <torch_musa/csrc/aten/musa/MUSAContext.h>" in out
    assert "// cudaMalloc in a comment stays" in out and '"needs cudaMalloc"' in out
    assert "relu_cuda" in out and "my_cudaMalloc" in out and "__mt_bfloat16" in out
    assert "t.is_privateuseone()" in out and "musaStream_t s = at::musa::getCurrentMUSAStream()" in out
    assert "c10::musa::MUSAGuard" in out and "musaMalloc(0, 0)" in out
    assert translate_cpp(out, M2C) == src


def test_arch_guards_map_their_numbers_and_flag_unknown_ones():
    res = translate("#if __CUDA_ARCH__ >= 800\n#elif __CUDA_ARCH__ < 750\n#endif\n", C2M)
    assert "__MUSA_ARCH__ >= 220" in res.text and "__MUSA_ARCH__ < 750" in res.text
    assert len(res.warnings) == 1 and "750" in res.warnings[0]
    assert translate(res.text, M2C).text.startswith("#if __CUDA_ARCH__ >= 800")


def test_python_device_strings_and_calls():
    src = 'import torch\nx = torch.zeros(3, device="cuda:1").cuda()\ntorch.cuda.synchronize()\nok = x.is_cuda\n'
    out = translate(src, C2M).text
    assert out == 'import torch\nx = torch.zeros(3, device="musa:1").musa()\ntorch.musa.synchronize()\nok = x.is_musa\n'
    assert translate(out, M2C).text == src


KERNEL = "__global__ void k(float* y, const float* x) {{\n{body}\n}}\n"
HAZARDS = {  # rule -> (known-bad device code, known-good twin)
    "warp32": ("int lane = threadIdx.x & 31; y[lane] = x[lane];",
               "int lane = threadIdx.x % warpSize; y[lane] = x[lane];"),
    "shuffle-width": ("float v = __shfl_xor_sync(0xffffffff, x[0], 16);",
                      "float v = __shfl_xor_sync(0xffffffff, x[0], 16, 32);"),
    "static-shared": ("__shared__ float tile[TILE][TILE]; y[0] = tile[0][0];",
                      "__shared__ float tile[64][64]; y[0] = tile[0][0];"),
    "ptx": ('asm volatile("mov.u32 %0, %%laneid;" : "=r"(i));', "int i = threadIdx.x;"),
    "fp64": ("double acc = x[0]; y[0] = (float)acc;", "float acc = x[0]; y[0] = acc;"),
    "arch-guard": ("#if __CUDA_ARCH__ >= 750\ny[0] = 1;\n#endif", "#if __CUDA_ARCH__ >= 800\ny[0] = 1;\n#endif"),
    "cuda-graph": ("cudaGraph_t g;", "int g;"),
}


@pytest.mark.parametrize("rule", sorted(HAZARDS))
def test_checker_flags_each_hazard_and_not_its_fixed_twin(rule):
    bad, good = HAZARDS[rule]
    prelude = "#define TILE 96\n"  # 96 x 96 floats = 36 KB > 28 KB; 64 x 64 = 16 KB
    assert rule in {f.rule for f in check_cpp(prelude + KERNEL.format(body=bad))}
    assert not check_cpp(prelude + KERNEL.format(body=good))


def test_checker_reads_python_candidates_and_host_doubles_are_fine():
    honest_relu = (EXAMPLES_DIR / "cuda" / "honest_relu.py").read_text()
    assert check(honest_relu) == []
    assert check("void host(double s) { }\n" + KERNEL.format(body="y[0] = x[0];")) == []
    mse = check((EXAMPLES_DIR / "cuda" / "honest_mse_loss.py").read_text())
    assert mse and {f.rule for f in mse} == {"fp64"}  # its accumulator is double: not portable as is


def test_capabilities_by_architecture():
    caps = capabilities()
    assert caps[(2, 2)]["warp_size"] == 128 and caps[(2, 2)]["static_shared_bytes"] == 28 * 1024
    assert all("source" in c for c in caps.values())


def test_port_cli_translates_checks_and_refuses_bad_input(tmp_path):
    import subprocess
    import sys

    def port(*args):
        code = "import sys; from musacoder.musa.cli import port_app; sys.argv = ['port', *sys.argv[1:]]; port_app()"
        return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)

    relu = EXAMPLES_DIR / "cuda" / "honest_relu.py"
    out = tmp_path / "relu_musa.py"
    assert port("c2m", str(relu), "-o", str(out)).returncode == 0 and "musa_sources" in out.read_text()
    assert port("m2c", str(out)).stdout == relu.read_text()
    bad = port("check", str(EXAMPLES_DIR / "cuda" / "honest_mse_loss.py"))
    assert bad.returncode == 1 and ":19: [fp64]" in bad.stdout
    missing = port("c2m", str(tmp_path / "nope.cu"))
    assert missing.returncode == 2 and "error:" in missing.stderr and "Traceback" not in missing.stderr
    (tmp_path / "bin.cu").write_bytes(b"\xff\xfe\x00")
    binary = port("check", str(tmp_path / "bin.cu"))
    assert binary.returncode == 2 and "not a text source" in binary.stderr
