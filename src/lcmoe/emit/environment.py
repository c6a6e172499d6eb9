"""Environment variables a plan needs, each with its reason."""

from __future__ import annotations

from lcmoe.config_io.paged_stash import stash_environment
from lcmoe.run import RunConfig


def environment(run: RunConfig) -> dict[str, tuple[str, str]]:
    """name → (value, reason)."""
    env: dict[str, tuple[str, str]] = {
        "PYTORCH_CUDA_ALLOC_CONF": (
            "expandable_segments:True",
            "avoids allocator-fragmentation OOMs at no cost in speed (PyTorch CUDA caching allocator)",
        ),
        "CUDA_DEVICE_MAX_CONNECTIONS": ("1", "orders TP/SP communication kernels before compute (Megatron default)"),
    }
    opt, hw = run.options, run.hardware
    if opt.cuda_graph_scope:
        env["NCCL_GRAPH_REGISTER"] = ("0", "expandable segments with CUDA graphs need it (cuda_graphs.py:2116-2122)")
    if opt.dispatcher == "hybridep":
        ranks = min(hw.nvlink_domain_size, run.layout.ep * run.layout.etp)
        env["NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"] = (str(ranks), "HybridEP's intra-domain rank count")
    if opt.optimizer_offload_fraction > 0 and hw.host_link_kind == "nvlink-c2c":
        env["NCCL_NET_GDR_C2C"] = ("1", "GPUDirect over NVLink-C2C for the optimizer offload copies")
    if opt.activation_offload_modules:
        env["NVTE_CPU_OFFLOAD_V1"] = (
            "1",
            "Bridge refuses fine-grained activation offloading on TE >= 2.10 without it (training/config.py:2053-2059)",
        )
    env.update(stash_environment(opt, run.model.gated_linear_unit))
    return env
