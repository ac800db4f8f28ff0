"""The all-reduce paths that one GPU can exercise (CUDA only; skipped elsewhere).

- The one-shot kernel sums every peer's buffer: here the "peers" are
  buffers on the same GPU, addressed through a device table of pointers as
  symmetric memory's `buffer_ptrs_dev` addresses them.
- `AllReduce` over a one-rank NCCL group: its symmetric-memory path (when
  torch can rendezvous one rank) and NCCL both return the input.

What needs two GPUs, NVLink reads of a peer's memory and TP=2 against TP=1
on CUDA, stays for a machine that has them (bench/gpu_check.sh runs
kernel_benchmark under torchrun there).
"""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("world_size", [2, 4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("numel", [1, 1000, 3 * 1024 + 5])
def test_one_shot_kernel_sums_every_peer(world_size, dtype, numel):
    from kvrouter.engine.parallel.symm_mem_all_reduce import one_shot_all_reduce

    generator = torch.Generator(device="cuda").manual_seed(world_size * numel)
    peers = [
        torch.randn(numel, device="cuda", generator=generator).to(dtype) for _ in range(world_size)
    ]
    table = torch.tensor([peer.data_ptr() for peer in peers], dtype=torch.int64, device="cuda")
    out = torch.full((numel,), float("nan"), dtype=dtype, device="cuda")

    one_shot_all_reduce(table.data_ptr(), out, world_size)
    torch.cuda.synchronize()

    # The kernel's order: fp32, peer by peer from zero; equal to the last bit.
    expected = torch.zeros(numel, device="cuda")
    for peer in peers:
        expected += peer.float()
    torch.testing.assert_close(out, expected.to(dtype), atol=0, rtol=0)


@pytest.fixture(scope="module")
def one_rank_all_reduce(tmp_path_factory):
    import torch.distributed as dist

    from kvrouter.engine.parallel.all_reduce import AllReduce

    rendezvous = tmp_path_factory.mktemp("nccl") / "rendezvous"
    dist.init_process_group("nccl", init_method=f"file://{rendezvous}", rank=0, world_size=1)
    try:
        yield AllReduce(dist.group.WORLD, torch.device("cuda"))
    finally:
        dist.destroy_process_group()


def test_nccl_over_one_rank_returns_the_input(one_rank_all_reduce):
    # Past the symmetric-memory bound, so NCCL takes it.
    large = torch.randn(1 << 20, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(one_rank_all_reduce(large.clone()), large)


def test_one_shot_over_one_rank_returns_the_input(one_rank_all_reduce):
    if one_rank_all_reduce.symm_mem is None:
        pytest.skip("torch symmetric memory could not rendezvous here")
    small = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    assert one_rank_all_reduce.symm_mem.fits(small)
    assert torch.equal(one_rank_all_reduce(small.clone()), small)
