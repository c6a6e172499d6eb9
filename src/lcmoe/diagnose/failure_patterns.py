"""The failures users report on Megatron-LM / Megatron Bridge / DeepEP, as data (issue #35 item 7).

Each ``FailurePattern`` is one row: an id, the failure class it belongs to, the literal text that
identifies it in a log (``needles``), an optional anchored ``detail`` regex read at the needle
(bounded quantifiers only), the explanation, the fix, the diagnose rule id
(``rules/advice.py`` ``FAILURE_RULES``) and where the text comes from (the public report, and the
source file:line that prints it, at a stated commit). ``diagnose/failures.py`` matches them.

Commits the file:line citations refer to: Megatron-LM ``d98e8a6``, Megatron-Bridge ``067f987``,
DeepEP ``dd758ca``, TransformerEngine ``d0067d0``."""

from __future__ import annotations

import re
from dataclasses import dataclass

MLM = "NVIDIA/Megatron-LM@d98e8a6:"
BRIDGE = "NVIDIA-NeMo/Megatron-Bridge@067f987:"
DEEPEP = "deepseek-ai/DeepEP@dd758ca:"
TE = "NVIDIA/TransformerEngine@d0067d0:"
GH = "https://github.com/"

# Every needle contains one of these (tests/test_failures.py checks it): a line without any of
# them costs len(TRIGGERS) substring tests and nothing more.
TRIGGERS = ("DeepEP", "HybridEP", "NaN", "Watchdog", "divisible", "capturing", "is invalid for input", "CPU wait")


@dataclass(frozen=True, slots=True)
class FailurePattern:
    """One known failure: how a log line shows it, what it means, what to change, and its source."""

    id: str
    failure_class: str
    needles: tuple[str, ...]
    explanation: str
    fix: str
    rule: str
    sources: tuple[str, ...]
    library: str | None = None
    """The communication library the line blames (deepep, hybridep, nccl), if any."""
    detail: re.Pattern[str] | None = None
    """Matched at the needle (``re.match``) to pick numbers out of the line; bounded quantifiers."""
    requires: tuple[tuple[str, str], ...] = ()
    """(setting, token): the setting's value must contain token ("" = set and not false/none)."""
    when_unknown: bool = False
    """Report as unconfirmed when the settings ``requires`` names are not known."""
    after: str | None = None
    """A text (traceback frame) that must appear within ``failures.CONTEXT_LINES`` lines before the needle."""


_WATCHDOG = "Watchdog caught collective operation timeout"

PATTERNS: tuple[FailurePattern, ...] = (
    # ---- (a) DeepEP dispatch / combine timeouts --------------------------------------------
    FailurePattern(
        id="deepep-dispatch-cpu-timeout",
        failure_class="deepep-timeout",
        needles=("DeepEP error: timeout (dispatch CPU)", "Dispatch CPU wait exception"),
        library="deepep",
        explanation=(
            "DeepEP's host side waited longer than its CPU timeout for the notify kernel to report how "
            "many tokens each rank receives (internode_dispatch; 'Dispatch CPU wait' in DeepEP's newer "
            "elastic buffer). moe_recv_expert_counter = -1 on every "
            "expert means the RDMA metadata never arrived: the NVSHMEM/IBGDA path between nodes is not "
            "working, or a peer rank never reached this MoE layer"
        ),
        fix=(
            "run DeepEP's tests/test_internode.py on the same nodes and container; check NVSHMEM (the "
            "version DeepEP was built against), IBGDA and the NIC-GPU mapping; make sure every rank reaches "
            "the first MoE layer (a rank stuck in JIT compilation or CUDA-graph capture also times out the "
            "others); confirm the model with moe_token_dispatcher_type=alltoall, and on GB200/GB300 use "
            "moe_flex_dispatcher_backend=hybridep"
        ),
        rule="DG-DEEPEP-TIMEOUT",
        sources=(
            GH + "NVIDIA-NeMo/Megatron-Bridge/issues/1335",
            GH + "NVIDIA-NeMo/Megatron-Bridge/issues/5067",
            DEEPEP + "csrc/legacy/buffer.hpp:1105",
            DEEPEP + "csrc/elastic/buffer.hpp:1063",
        ),
    ),
    FailurePattern(
        id="deepep-cpu-recv-timeout",
        failure_class="deepep-timeout",
        needles=("DeepEP error: CPU recv timeout",),
        library="deepep",
        explanation=(
            "DeepEP's host side timed out waiting for the intranode notify kernel's receive counts: a peer "
            "GPU in the NVLink domain did not join this dispatch"
        ),
        fix=(
            "check that every rank of the EP group reached the same MoE layer (a hung or slower rank), run "
            "DeepEP's tests/test_intranode.py on the node; confirm with moe_token_dispatcher_type=alltoall"
        ),
        rule="DG-DEEPEP-TIMEOUT",
        sources=(DEEPEP + "csrc/legacy/buffer.hpp:596",),
    ),
    FailurePattern(
        id="deepep-internode-kernel-timeout",
        failure_class="deepep-timeout",
        needles=(
            "DeepEP dispatch forwarder timeout",
            "DeepEP dispatch NVL receiver timeout",
            "DeepEP dispatch RDMA sender timeout",
            "DeepEP RDMA sender coordinator timeout",
            "DeepEP combine NVL sender timeout",
            "DeepEP combine forwarder (",
            "DeepEP combine RDMA receiver timeout",
        ),
        library="deepep",
        detail=re.compile(r"DeepEP [\w ()]{1,48}?timeout[^,]{0,24}, channel: (\d{1,6}), RDMA: (\d{1,6})"),
        explanation=(
            "a DeepEP internode (RDMA + NVLink) dispatch or combine kernel gave up waiting for data from a "
            "peer: the RDMA transport between nodes stalled (RoCE/IB configuration, adaptive routing, "
            "queue pairs) or a peer rank is not running the same dispatch"
        ),
        fix=(
            "run DeepEP's tests/test_internode.py across the same nodes; turn adaptive routing off, check "
            "NVSHMEM_IB_* / IBGDA settings and the QP count (num_qps_per_rank); upgrade DeepEP (concurrent QP "
            "submissions timed out before deepseek-ai/DeepEP#181); confirm with moe_token_dispatcher_type=alltoall"
        ),
        rule="DG-DEEPEP-TIMEOUT",
        sources=(
            GH + "deepseek-ai/DeepEP/issues/137",
            GH + "deepseek-ai/DeepEP/issues/158",
            GH + "deepseek-ai/DeepEP/pull/181",
            DEEPEP + "csrc/kernels/legacy/internode.cu:884",
            DEEPEP + "csrc/kernels/legacy/internode.cu:1087",
            DEEPEP + "csrc/kernels/legacy/internode.cu:2182",
        ),
    ),
    FailurePattern(
        id="deepep-kernel-timeout",
        failure_class="deepep-timeout",
        needles=("DeepEP timeout for dispatch", "DeepEP timeout for combine", "DeepEP timeout check failed"),
        library="deepep",
        explanation=(
            "a DeepEP dispatch or combine kernel (intranode senders/receivers, or the barrier's timeout check) "
            "waited past its GPU timeout for a peer rank"
        ),
        fix=(
            "check that all EP ranks run the same number of dispatches (a rank that skipped or hung), run "
            "DeepEP's tests on the node; confirm with moe_token_dispatcher_type=alltoall"
        ),
        rule="DG-DEEPEP-TIMEOUT",
        sources=(
            GH + "deepseek-ai/DeepEP/issues/382",
            DEEPEP + "csrc/kernels/legacy/intranode.cu:461",
            DEEPEP + "csrc/kernels/legacy/intranode.cu:929",
            DEEPEP + "csrc/kernels/legacy/utils.cuh:539",
        ),
    ),
    # ---- (b) the requested dispatcher silently replaced or unavailable ---------------------------
    FailurePattern(
        id="deepep-fallback-alltoall",
        failure_class="dispatcher-replaced",
        needles=("DeepEP is only applicable to",),
        library="deepep",
        detail=re.compile(r"DeepEP is only applicable to [^:]{1,120}: ([^.]{1,64})\."),
        explanation=(
            "Bridge's apply_flex_dispatcher_backend refused moe_flex_dispatcher_backend=deepep on this GPU "
            "(its allow-list is Ampere, Hopper, B200 and B300: GB200/GB300 are not on it) and replaced the "
            "dispatcher with alltoall. Only a rank-0 warning is printed and training goes on: the run's "
            "speed and memory are alltoall's, not DeepEP's"
        ),
        fix=(
            "on GB200/GB300 NVL72 request moe_flex_dispatcher_backend=hybridep; elsewhere set "
            "moe_token_dispatcher_type=alltoall explicitly so the plan and the run agree (lcmoe plan "
            "--dispatchers hybridep or alltoall)"
        ),
        rule="DG-DISPATCHER-FALLBACK",
        sources=(
            GH + "NVIDIA-NeMo/Megatron-Bridge/issues/5992",
            BRIDGE + "src/megatron/bridge/training/flex_dispatcher_backend.py:65",
        ),
    ),
    FailurePattern(
        id="hybridep-fallback-alltoall",
        failure_class="dispatcher-replaced",
        needles=("HybridEP is only applicable",),
        library="hybridep",
        detail=re.compile(r"HybridEP is only applicable [^:]{1,140}: ([^.]{1,64})\."),
        explanation=(
            "Bridge refused moe_flex_dispatcher_backend=hybridep on this GPU (compute capability outside "
            "8.x-10.x) and replaced the dispatcher with alltoall; only a rank-0 warning is printed"
        ),
        fix=(
            "use alltoall (or deepep on Ampere/Hopper/B200/B300) explicitly so the plan matches the run: "
            "lcmoe plan --dispatchers alltoall,deepep"
        ),
        rule="DG-DISPATCHER-FALLBACK",
        sources=(
            GH + "NVIDIA-NeMo/Megatron-Bridge/pull/5207",
            BRIDGE + "src/megatron/bridge/training/flex_dispatcher_backend.py:74",
        ),
    ),
    FailurePattern(
        id="flex-backend-refused",
        failure_class="dispatcher-replaced",
        needles=("DeepEP is supported for Ampere", "HybridEP is supported for GB200"),
        detail=re.compile(r"\w{6,8} is supported for [^:]{1,120}: ([^.\n]{1,64})"),
        explanation=(
            "Bridge's validation refused a flex dispatcher the config still asks for on this GPU: the "
            "recipe's DeepEP backend metadata survived the alltoall fallback and the config finalizer turned "
            "the dispatcher back to flex"
        ),
        fix=(
            "set moe_flex_dispatcher_backend explicitly (hybridep on GB200/GB300, or None with "
            "moe_token_dispatcher_type=alltoall), or upgrade Bridge past NVIDIA-NeMo/Megatron-Bridge#5207"
        ),
        rule="DG-DISPATCHER-FALLBACK",
        sources=(
            GH + "NVIDIA-NeMo/Megatron-Bridge/pull/5207",
            BRIDGE + "src/megatron/bridge/training/flex_dispatcher_backend.py:100",
        ),
    ),
    FailurePattern(
        id="flex-backend-not-installed",
        failure_class="dispatcher-replaced",
        needles=("HybridEP is not installed", "DeepEP is not installed"),
        explanation=(
            "the flex dispatcher was selected, but its package (deep_ep, or its HybridEP build) is not "
            "importable in the run's container, so the model cannot be built"
        ),
        fix=(
            "install DeepEP (HybridEP: its hybrid-ep branch) in the container, or run lcmoe preflight --plan "
            "DIR on a node first; to go on without it use moe_token_dispatcher_type=alltoall"
        ),
        rule="DG-DISPATCHER-FALLBACK",
        sources=(
            GH + "NVIDIA-NeMo/Megatron-Bridge/pull/3867",
            MLM + "megatron/core/transformer/moe/token_dispatcher.py:1057",
            MLM + "megatron/core/transformer/moe/token_dispatcher.py:1284",
        ),
    ),
    # ---- (c) CUDA graphs in the MoE path, by scope -----------------------------------------------
    FailurePattern(
        id="cuda-graph-attn-nan",
        failure_class="cuda-graph",
        needles=("found NaN in local grad norm",),
        requires=(("cuda_graph_scope", "attn"),),
        when_unknown=True,
        explanation=(
            "NaN in the gradient norm with Transformer Engine CUDA graphs on the attn scope: reported on "
            "Qwen3-235B (EP 8, A2A overlap) after ~80 normal iterations, grad norm oscillating into the "
            "millions, then NaN; removing the attn graphs made it disappear"
        ),
        fix=(
            "rerun without the attn graph (cuda_graph_scope without attn, or cuda_graph_impl=none) from the "
            "last checkpoint to confirm; keep it off until the Megatron-Core/TE versions are fixed"
        ),
        rule="DG-CUDA-GRAPH-SCOPE",
        sources=(
            GH + "NVIDIA/Megatron-LM/issues/5966",
            MLM + "megatron/core/distributed/param_and_grad_buffer.py:358",
        ),
    ),
    FailurePattern(
        id="cuda-graph-moe-hang",
        failure_class="cuda-graph",
        needles=(_WATCHDOG,),
        requires=(("cuda_graph_scope", ""),),
        explanation=(
            "a collective timed out with TE-scoped CUDA graphs on: runs with cuda_graph_scope "
            "attn,moe_router,moe_preprocess (and attn or moe_router,moe_preprocess alone) hang at "
            "iteration 0 right after graph capture, GPUs idle, rank 0 stuck in the token dispatcher's "
            "dispatch_with_permute"
        ),
        fix=(
            "rerun with cuda_graph_impl=none to confirm (py-spy dump a rank: dispatch_with_permute means "
            "this hang); then graph only attn, or wait for the fix in the MoE token dispatcher"
        ),
        rule="DG-CUDA-GRAPH-SCOPE",
        sources=(GH + "NVIDIA-NeMo/Megatron-Bridge/issues/3517",),
        library="nccl",
    ),
    FailurePattern(
        id="cuda-graph-capture-dynamic",
        failure_class="cuda-graph",
        needles=("operation not permitted when stream is capturing",),
        explanation=(
            "something inside a captured CUDA-graph scope synchronised with the host or changed shape: the "
            "MoE token dispatcher reads token counts back to the CPU (tensor.cpu()), and dispatch, experts "
            "and combine have data-dependent shapes that a graph cannot hold"
        ),
        fix=(
            "graph only the static part (cuda_graph_scope attn,moe_router,moe_preprocess); the moe scope "
            "needs fixed shapes (drop-and-pad: moe_expert_capacity_factor with "
            "moe_pad_expert_input_to_capacity); variable-length (THD) batches need static padding"
        ),
        rule="DG-CUDA-GRAPH-SCOPE",
        sources=(GH + "NVIDIA/Megatron-LM/issues/1598", GH + "pytorch/pytorch/issues/87794"),
    ),
    # ---- (d) 1F1B A2A overlap deadlock ----------------------------------------------------------
    FailurePattern(
        id="a2a-overlap-deadlock",
        failure_class="a2a-overlap",
        needles=(_WATCHDOG,),
        requires=(("overlap_moe_expert_parallel_comm", "true"),),
        detail=re.compile(_WATCHDOG + r": WorkNCCL\(SeqNum=(\d{1,12}), OpType=(\w{1,32})"),
        explanation=(
            "a collective timed out with overlap_moe_expert_parallel_comm on. The A2A-overlap scheduler "
            "gates the compute and communication streams on one shared CUDA event, so two communication "
            "nodes (moe_dispatch, moe_combine) can become ready at once and ranks enqueue their all-to-alls "
            "in different orders: NCCL deadlocks, seen early in large runs"
        ),
        fix=(
            "rerun with overlap_moe_expert_parallel_comm=false (Bridge: "
            "comm_overlap.overlap_moe_expert_parallel_comm=false) to confirm, then upgrade Megatron-Core to "
            "a release with the fix for NVIDIA/Megatron-LM#1810"
        ),
        rule="DG-A2A-OVERLAP",
        sources=(GH + "NVIDIA/Megatron-LM/issues/1810",),
        library="nccl",
    ),
    # ---- (e) CP / THD / SP divisibility at runtime -----------------------------------------------
    FailurePattern(
        id="cp-seq-not-divisible",
        failure_class="cp-divisibility",
        needles=("Sequence length must be divisible by 2 * context parallel size",),
        explanation=(
            "with context parallelism each sequence is cut into 2·CP chunks (two per CP rank, for causal "
            "load balance), so seq_length must be a multiple of 2·CP"
        ),
        fix="set seq_length to a multiple of 2·CP (and of CP·TP with sequence parallelism), or change CP",
        rule="DG-CP-DIVISIBLE",
        sources=(BRIDGE + "src/megatron/bridge/training/config.py:1576",),
    ),
    FailurePattern(
        id="cp-sp-collate-multiple",
        failure_class="cp-divisibility",
        needles=("must be divisible by the CP/SP collate padding multiple",),
        detail=re.compile(r"must be divisible by the CP/SP collate padding multiple \((\d{1,12})\)"),
        explanation=(
            "Bridge pads each batch to lcm(2·CP, CP·TP with sequence parallelism); the dataset's "
            "seq_length is not a multiple of it"
        ),
        fix="set the dataset's seq_length to a multiple of the number in the message",
        rule="DG-CP-DIVISIBLE",
        sources=(BRIDGE + "src/megatron/bridge/training/config.py:1370",),
    ),
    FailurePattern(
        id="sp-first-dim-not-divisible",
        failure_class="cp-divisibility",
        needles=("First dimension of the tensor should be divisible by tensor parallel size",),
        explanation=(
            "sequence parallelism splits each CP rank's S/CP tokens across TP, so the sequence (each packed "
            "batch with THD) must be a multiple of CP·TP; packed or variable-length batches hit this at run "
            "time, not at start-up"
        ),
        fix=(
            "pad sequences (each pack, with packing) to a multiple of CP·lcm(2, TP), i.e. 2·CP·TP for odd "
            "TP, CP·TP for even TP; or turn sequence parallelism off"
        ),
        rule="DG-CP-DIVISIBLE",
        sources=(
            GH + "NVIDIA-NeMo/RL/issues/2110",
            MLM + "megatron/core/tensor_parallel/mappings.py:74",
        ),
    ),
    FailurePattern(
        id="te-cp-seq-per-gpu-odd",
        failure_class="cp-divisibility",
        needles=("Sequence length per GPU needs to be divisible by 2",),
        explanation=(
            "Transformer Engine's context-parallel attention splits each rank's sequence into two halves: "
            "the per-rank length (S/CP) is odd, so S is not a multiple of 2·CP"
        ),
        fix="pad the sequence (each document with THD) to a multiple of 2·CP",
        rule="DG-CP-DIVISIBLE",
        sources=(TE + "transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py:1571",),
    ),
    FailurePattern(
        id="thd-cp-reshape",
        failure_class="cp-divisibility",
        needles=("is invalid for input of size",),
        after="get_batch_on_this_cp_rank",
        detail=re.compile(r"is invalid for input of size (\d{1,15})"),
        explanation=(
            "get_batch_on_this_cp_rank views every batch tensor as [2·CP, S/(2·CP)] chunks; a tensor whose "
            "length is not a multiple of 2·CP (a packed batch not padded for CP, or THD metadata such as "
            "cu_seqlens passed in as if it were a sequence) cannot be reshaped"
        ),
        fix=(
            "pad each packed sequence to a multiple of 2·CP (Bridge: packed_sequence_specs with "
            "context_parallel_size, pad_seq_to_mult) and keep cu_seqlens out of the CP slicing; upgrade "
            "Bridge past NVIDIA-NeMo/Megatron-Bridge#1964"
        ),
        rule="DG-CP-DIVISIBLE",
        sources=(
            GH + "NVIDIA-NeMo/Megatron-Bridge/issues/1964",
            GH + "NVIDIA-NeMo/Megatron-Bridge/issues/1292",
            MLM + "megatron/core/utils.py:2549",
        ),
    ),
)

PATTERNS_BY_ID: dict[str, FailurePattern] = {p.id: p for p in PATTERNS}
CONTEXT_NEEDLES: tuple[str, ...] = tuple(sorted({p.after for p in PATTERNS if p.after}))
