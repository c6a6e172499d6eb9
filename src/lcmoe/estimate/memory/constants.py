"""Byte widths and fixed sizes the memory terms share, each with its source."""

from __future__ import annotations

BF16 = 2
FP32 = 4
INT32 = 4
INT64 = 8  # torch.topk returns int64 indices
MIB = 1024.0**2
GIB = 1024.0**3

# Bridge's full-iteration CUDA-graph bundle for dropless MoE pads every expert tensor to a static
# per-rank token budget and stashes what backward needs in preallocated GPU pages
# (perf_recipes ``set_full_iter_cg_configs``: moe_expert_rank_capacity_factor=1.5,
# moe_paged_stash=True, moe_paged_stash_buffer_size_factor_cuda=1.2; facts §7).
FULL_ITERATION_RANK_CAPACITY = 1.5
FULL_ITERATION_STASH_FACTOR = 1.2

# GPUs of one NVLink domain when no hardware is given: an HGX baseboard's 8 (HardwareSpec
# ``nvlink_domain_size``: "8 for HGX, 72 for NVL72"), the same default as architecture "hopper".
DEFAULT_NVLINK_DOMAIN = 8

# Scale blocks of the quantized formats: MXFP8 one E8M0 scale per 32 values (FP8 blockwise's one
# FP32 scale per 128 values rounded up to it), NVFP4 one E4M3 scale per 16 FP4 values of half a
# byte (OCP MX spec v1.0 block size 32; NVIDIA NVFP4 block size 16).
MXFP8_SCALE_BLOCK = 32
NVFP4_SCALE_BLOCK = 16
NVFP4_BYTES = 0.5

# Transformer Engine's cuBLAS(Lt) workspace: 32 MiB on compute capability >= 9, 4 MiB before
# (transformer_engine/pytorch/module/base.py ``get_cublas_workspace_size_bytes``; newer TE adds
# 256 B of scales), plus one more per grouped-GEMM stream, ``tex.get_num_cublas_streams()`` = 4
# (base.py ``get_multi_stream_cublas_workspace``).
TE_CUBLAS_WORKSPACE_BYTES = 32 * MIB
TE_CUBLAS_WORKSPACE_BYTES_PRE_HOPPER = 4 * MIB
TE_GROUPED_GEMM_STREAMS = 4

# DeepEP: NVLink peers one rank's intranode buffer serves (csrc/kernels/configs.cuh
# ``#define NUM_MAX_NVL_PEERS 8``, a compile-time constant); an EP group larger than that uses
# the internode (RDMA) path and its buffer, whatever the hardware's NVLink domain. Each buffer ≈1 GiB
# (DeepEP defaults; megatron-bridge-facts.md §6.13).
DEEPEP_NVL_PEERS = 8
DEEPEP_BUFFER_BYTES = GIB

# HybridEP keeps one FP32 scale per 128 dispatched values (DeepEP hybrid-ep
# csrc/hybrid_ep/hybrid_ep.cu ``allocate_buffer``, scaling-factor buffers of hidden/128).
HYBRIDEP_SCALE_BLOCK = 128
