"""CPU-only guards of head_stats' GPU paths (fake cuda:0 tensors, tests/fake_cuda.py): no host
synchronisation, and a kernel count set by the number of blocks, not by the sequence length.

The torch path (``HEADWISE_TRITON=0``) at n=4096, 16 heads, causal: device-sized blocks
(headwise.fast.DEVICE_BLOCK_ELEMENTS) give 5 blocks; each block is at most ~75 aten ops (the
matmul, the mask, the softmax with its entropy and max, ~10 reductions and their row writes,
one topk, the induction targets), plus ~30 to set up and for the NaN masks. The Triton path is
one kernel launch plus ~30 ops around it (output buffers, the NaN masks, sorting the top-k).
Each test also runs a mutation (CPU-sized blocks, a scalar read back) and checks the guard
catches it, so the guard cannot pass vacuously.
"""

import pytest

from tests.fake_cuda import run

N, H, D = 4096, 16, 64
SETUP = f'''
import headwise.stats
from headwise import fast
q, k = cuda(1, {H}, {N}, {D}), cuda(1, {H}, {N}, {D})
ids = torch.empty(1, {N}, dtype=torch.long, device="cuda:0")
pad = torch.empty(1, 1, 1, {N}, dtype=torch.bool, device="cuda:0")
blocks = len(headwise.stats._spans({N}, lambda r1: r1, {H}, fast.DEVICE_BLOCK_ELEMENTS))
assert blocks == 5, blocks
'''
PER_BLOCK, FIXED = 75, 40


def _torch_path(mutation: str = "") -> dict:
    return run(SETUP + mutation + '''
with counted("causal"):
    headwise.stats.head_stats(q, k, causal=True, token_ids=ids)
with counted("padding"):
    headwise.stats.head_stats(q, k, mask=pad, token_ids=ids)
''', env={"HEADWISE_TRITON": "0"})


def test_the_torch_path_on_a_gpu_reads_nothing_back_and_runs_few_large_blocks():
    counts = _torch_path()
    causal, padding = counts["causal"], counts["padding"]
    for c in (causal, padding):
        assert c.error is None, c.traceback
        assert c.syncs == [] and c.h2d == [], str(c)
    # 5 causal blocks; 8 full-width ones (4096 rows x 65536 keys x heads in 2**25 elements)
    assert causal.histogram()["aten.topk"] == 5 and padding.histogram()["aten.topk"] == 8
    assert causal.kernels <= FIXED + 5 * PER_BLOCK, str(causal)
    assert padding.kernels <= FIXED + 8 * PER_BLOCK, str(padding)


def test_the_guard_catches_cpu_sized_blocks_and_a_scalar_read():
    """Mutations: the CPU's cache-sized chunks on the GPU (the 509x of gpu-facts.md: a topk and
    ~70 ops per 16 rows), and the NaN check reading a scalar back (the CPU's shortcut)."""
    small = _torch_path("fast.block_elements = lambda *t, cpu: cpu\n")["causal"]
    assert small.kernels > FIXED + 5 * PER_BLOCK and small.histogram()["aten.topk"] > 5
    synced = _torch_path("headwise.stats.finite = lambda *t: bool(t[0].sum() == 0)\n")["causal"]
    assert synced.syncs, str(synced)


def _triton_path(mutation: str = "") -> dict:
    pytest.importorskip("triton")
    # (a mutation that reads a scalar back stops the call there: before the launch)
    return run(SETUP + f"MUTATED = {bool(mutation)}\n" + '''
from headwise.fast import stats_triton
launched = []
class _Stub:  # fake tensors have no memory: record the launch instead of running it
    def __getitem__(self, grid):
        return lambda *args, **kwargs: launched.append(grid)
stats_triton._stats_kernel = _Stub()
''' + mutation + '''
with counted("triton"):
    headwise.stats.head_stats(q, k, causal=True, token_ids=ids)
assert len(launched) == 1 or MUTATED, launched
''')


def test_the_triton_path_is_one_launch_and_no_host_read():
    c = _triton_path()["triton"]
    assert c.error is None, c.traceback
    assert c.syncs == [] and c.h2d == [] and "aten.topk" not in c.histogram(), str(c)
    assert c.kernels <= 30, str(c)  # 5 around the launch, ~22 for the NaN rule's masks
    synced = _triton_path("headwise.stats.finite = lambda *t: bool(t[0].sum() == 0)\n")
    assert synced["triton"].syncs


def _catalogue_call(mutation: str = "") -> dict:
    return run('''
from headwise.analysis import catalogue as C
from headwise.analysis.catalogue.inputs import Prepared
n, h = 512, 4
ids = torch.empty(2, n, dtype=torch.long, device="cuda:0")
lens = torch.empty(2, dtype=torch.long, device="cuda:0")
layer = C._Layer(h, 2 * 8 + 3, 16).to("cuda:0")
layer.grow(50)
q, k = cuda(2, h, n, 16), cuda(2, h, n, 16)
''' + mutation + '''
with counted("layer"):  # one attention call of one layer, as the catalogue's observer sees it
    C._add_call(layer, Prepared(None, {"tgt": (ids, lens)}, 2), "decoder_self", q, k, None,
                True, None, 8, None)
''', env={"HEADWISE_TRITON": "0"})


def test_the_catalogue_reads_nothing_back_inside_the_per_layer_collection():
    """Its running sums stay on the device until the end (one move to the CPU); the token
    tables are widened once per batch, before the model runs."""
    c = _catalogue_call()["layer"]
    assert c.error is None, c.traceback
    assert c.syncs == [] and c.h2d == [] and c.d2h == [], str(c)
    assert c.kernels <= 300, str(c)  # head_stats (1 block), the LSE, 1 block of weights, sums
    # the old way: sums on the CPU, each partial sum read back (x.double().cpu())
    moved = _catalogue_call("C._Layer.to(layer, 'cpu')\n_double = torch.Tensor.double\n"
                            "torch.Tensor.double = lambda self: _double(self).cpu()\n")
    assert moved["layer"].d2h, str(moved["layer"])
