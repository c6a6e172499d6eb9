"""Megatron Bridge's own start-up validation (``runtime_config_update``) accepts what lcmoe emits.

The real megatron-bridge 0.6.2 + megatron-core 0.19.2 run in a second interpreter
(``LCMOE_BRIDGE_PYTHON``, built by ``.ci/run``; tests/bridge_runtime.py says how a CPU stands in
for what it lacks). Every case goes the way a user's launch goes: the recipe lcmoe names, then the
emitted overrides (or the emitted YAML) through Bridge's Hydra/OmegaConf override code, then
``runtime_config_update`` with ``WORLD_SIZE`` = the plan's GPU count. Skipped when the
interpreter is not there.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from lcmoe.catalog import load_hardware, load_model
from lcmoe.config_io.bridge import (
    MIXED_PRECISION,
    keeps_bf16_grad_buffer,
    mixed_precision_fields,
    parse_override_lines,
    recipe_for,
    recipe_has_comm_overlap,
    run_from_overrides,
)
from lcmoe.emit.bridge import overrides_text, yaml_config
from lcmoe.errors import LcmoeError
from lcmoe.layout import auto_pipeline_layout
from lcmoe.plan.search import PlanRequest, search
from lcmoe.rules.legality import violations
from lcmoe.run import RunConfig
from lcmoe.workload import TrainingOptions
from tests.helpers import make_run, with_layout, with_options
from tests.test_bridge_fields import _feature_runs

BRIDGE_PYTHON = os.environ.get("LCMOE_BRIDGE_PYTHON", "")
HERE = Path(__file__).resolve().parent
HF_DIRS = {
    "deepseek-ai/DeepSeek-V3": HERE / "data/hf/deepseek-v3",
    "Qwen/Qwen3-235B-A22B": HERE / "data/hf/qwen3-235b-a22b",
    "Qwen/Qwen3-30B-A3B": HERE / "data/hf/qwen3-30b-a3b",
    "Qwen/Qwen3-Next-80B-A3B-Instruct": HERE / "data/hf/qwen3-next-80b-a3b",
    "meta-llama/Meta-Llama-3-70B": HERE / "data/hf/llama3-70b",
    "zai-org/GLM-5.2": HERE / "data/hf/glm-5.2",
}
# (model, GPU, GPUs, sequence length): the long-context requests the README and the guidance use.
REQUESTS = (
    ("deepseek-v3", "h100", 256, 131072),
    ("qwen3-235b-a22b", "gb200", 128, 131072),
    ("qwen3-30b-a3b", "h100", 16, 32768),
    ("qwen3-next-80b-a3b", "h100", 64, 32768),
)

pytestmark = pytest.mark.skipif(
    not (BRIDGE_PYTHON and Path(BRIDGE_PYTHON).exists()),
    reason="LCMOE_BRIDGE_PYTHON (an interpreter with megatron-bridge 0.6.2) is not set; .ci/run builds one",
)


def bridge_answer(
    cases: list[dict[str, Any]], mixed_precision_names: list[str] | None = None, timeout: int = 600
) -> dict[str, Any]:
    """One run of bridge_runtime.py under the real Bridge interpreter over ``cases``: its JSON answer."""
    request = {
        "hf_dirs": {k: str(v) for k, v in HF_DIRS.items()},
        "cases": cases,
        "mixed_precision_names": mixed_precision_names or [],
    }
    done = subprocess.run(
        [BRIDGE_PYTHON, str(HERE / "bridge_runtime.py")],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def bridge_results(cases: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each case's verdict from :func:`bridge_answer`, by case name."""
    return {r["name"]: r for r in bridge_answer(cases)["results"]}


# What a LoRA launcher adds at run time (launchers.CHECKPOINT_VARIABLE): the base checkpoint.
# (Bridge checks that the path exists: the test points it at an empty folder.)
BASE_CHECKPOINT = "checkpoint.pretrained_checkpoint={}"


def _case(name: str, run: RunConfig, tmp: Path, *, as_yaml: bool = False) -> dict[str, Any]:
    case: dict[str, Any] = {
        "name": name,
        "recipe": recipe_for(run.model, run.options),
        "world_size": run.layout.world_size,
    }
    if as_yaml:
        path = tmp / f"{len(list(tmp.iterdir()))}.yaml"
        path.write_text(yaml_config(run))
        case["yaml"] = str(path)
    else:
        case["overrides"] = overrides_text(run).split()
    if run.options.is_lora:
        base = tmp / "base-checkpoint"
        base.mkdir(exist_ok=True)
        case["overrides"] = [*case.get("overrides", []), BASE_CHECKPOINT.format(base)]
    return case


def _lora_runs() -> list[tuple[str, RunConfig]]:
    """LoRA through Bridge's PEFT recipes: a planned Qwen3-30B run (every default target, SP input
    re-gather) and the Llama3-70B perf layout (qkv adapters, rank 16)."""
    request = PlanRequest(
        model=load_model("qwen3-30b-a3b"),
        hardware=load_hardware("h100"),
        num_gpus=16,
        seq_len=32768,
        top_k=1,
        peft="lora",
        lora_input_regather=True,
    )
    qwen = search(request).plans[0].run
    llama = with_options(
        make_run("llama3-70b", "gb200", seq_len=4096, cp=1, ep=1, pp=2, vpp=20, gpus=8, gbs=32),
        peft="lora",
        lora_rank=16,
        lora_targets=frozenset({"linear_qkv"}),
    )
    return [("lora/qwen3-30b-a3b", qwen), ("lora/llama3-70b", llama)]


def _dsa_runs() -> list[tuple[str, RunConfig]]:
    """GLM-5.2 (DSA) as its card ran it: PP11 at 2K on 352 H100, and 200K with CP32 all-gather
    (the only CP DSA runs) at PP19 on 608."""
    spec = load_model("glm-5.2")
    pretrain = with_layout(
        make_run("glm-5.2", seq_len=2048, cp=1, ep=32, pp=11, vpp=1, gpus=352, gbs=1024, recompute_granularity="full"),
        pipeline_layout=spec.recipe_pipeline_layouts["11x1"],
    )
    long_sft = with_layout(
        make_run(
            "glm-5.2", seq_len=200_000, cp=32, ep=32, pp=19, vpp=1, gpus=608, gbs=13, recompute_granularity="full"
        ),
        pipeline_layout=spec.recipe_pipeline_layouts["19x1"],
        cp_comm_type="all_gather",
    )
    for run in (pretrain, long_sft):
        assert violations(run) == []
    return [("dsa/glm-5.2/pp11", pretrain), ("dsa/glm-5.2/cp32", long_sft)]


def _hierarchical_cp_runs() -> list[tuple[str, RunConfig]]:
    """a2a+p2p CP as the planner writes it: Llama3-70B at TP 1, CP 16 = [8, 2] over two 8-GPU nodes
    (PP 4, 64 GPUs), and DeepSeek-V3 at TP 4, CP 16 = [2, 8] (the a2a group fills one node)."""
    llama = with_layout(
        make_run("llama3-70b", seq_len=65536, tp=1, cp=16, ep=1, pp=4, vpp=1, gpus=64, recompute_granularity="full"),
        cp_comm_type="a2a+p2p",
        hierarchical_context_parallel_sizes=(8, 2),
    )
    dsv3 = with_layout(
        make_run(tp=4, cp=16, ep=64, pp=4, vpp=4, gpus=256),
        cp_comm_type="a2a+p2p",
        hierarchical_context_parallel_sizes=(2, 8),
        # The planner's balanced layout (the recipe's 4×4 one has "(…)*14", which the overrides
        # text does not quote for Hydra).
        pipeline_layout=auto_pipeline_layout(load_model("deepseek-v3"), 4, 4),
    )
    for run in (llama, dsv3):
        assert violations(run) == []
    return [("hcp/llama3-70b/cp16-8x2", llama), ("hcp/deepseek-v3/cp16-2x8", dsv3)]


def _hierarchical_cp_bad() -> list[tuple[str, RunConfig, list[str]]]:
    """a2a+p2p without its sizes (lcmoe: L-CP-HIER-SIZES), and with sizes whose product is not CP
    (the emitted [8,2] edited to [8,4]; lcmoe's reader refuses it, see the test)."""
    (_, good), _ = _hierarchical_cp_runs()
    no_sizes = with_layout(good, hierarchical_context_parallel_sizes=None)
    wrong = [
        "model.hierarchical_context_parallel_sizes=[8,4]"
        if line.startswith("model.hierarchical_context_parallel_sizes=")
        else line
        for line in overrides_text(good).split()
    ]
    return [("hcp-without-sizes", no_sizes, overrides_text(no_sizes).split()), ("hcp-product-not-cp", good, wrong)]


def _plans() -> list[tuple[str, RunConfig]]:
    runs = []
    for model, gpu, gpus, seq in REQUESTS:
        result = search(
            PlanRequest(model=load_model(model), hardware=load_hardware(gpu), num_gpus=gpus, seq_len=seq, top_k=3)
        )
        chosen = [*result.plans, *([result.fallback] if result.fallback else [])]
        assert chosen, f"no plan for {model} on {gpus} × {gpu} at {seq}"
        runs += [(f"{model}/{gpu}x{gpus}/{seq}/plan{i}", plan.run) for i, plan in enumerate(chosen)]
    return runs


def _known_bad() -> list[tuple[str, RunConfig, list[str]]]:
    """Layouts Bridge refuses, with the override lines that make them (emitter output + edits)."""
    base = make_run("deepseek-v3", cp=16, ep=32, pp=8, vpp=4, gpus=256)
    odd_seq = with_options(base, seq_len=131080)  # not a multiple of 2·CP
    return [("seq-not-multiple-of-2cp", odd_seq, overrides_text(odd_seq).split())]


def _layout_with_overlap_and_no_vpp() -> tuple[RunConfig, list[str]]:
    """What lcmoe emitted before VPP stayed explicit next to a pipeline layout: Bridge's EP-overlap
    setup refuses it (comm_overlap.py:495) although Megatron-Core alone would infer VPP."""
    run = with_options(
        with_layout(make_run("deepseek-v3", tp=8, cp=16, ep=128, pp=2, vpp=8, gpus=256), gbs=8),
        overlap_moe_expert_parallel_comm=True,
        dispatcher="hybridep",
    )
    lines = [
        "model.virtual_pipeline_model_parallel_size=null" if line.startswith("model.virtual_pipeline") else line
        for line in overrides_text(run).split()
    ]
    return run, lines


@dataclass(frozen=True)
class Verdicts:
    runs: dict[str, RunConfig]  # the good cases by name (each sent as overrides and as YAML)
    results: dict[str, dict[str, Any]]  # Bridge's answer by case name
    registered_precisions: dict[str, dict[str, Any]]  # Bridge's registered mixed-precision configs
    saved_configs: dict[str, Path]  # the config Bridge saved after start-up, by case name


@pytest.fixture(scope="module")
def bridge(tmp_path_factory: pytest.TempPathFactory) -> Verdicts:
    """One Bridge process for every case: its import chain alone takes ~10 s."""
    tmp = tmp_path_factory.mktemp("bridge")
    runs = dict(
        [
            *_plans(),
            *[(f"feature{i}", r) for i, r in enumerate(_feature_runs())],
            *_lora_runs(),
            *_dsa_runs(),
            *_hierarchical_cp_runs(),
        ]
    )
    cases = []
    for name, run in runs.items():
        saved = {"dump_yaml": str(tmp / f"saved-{len(cases)}.yaml")}  # logger.save_config_filepath
        cases += [{**_case(name, run, tmp), **saved}, _case(name + "/yaml", run, tmp, as_yaml=True)]
    old_run, old_lines = _layout_with_overlap_and_no_vpp()
    bad = [*_known_bad(), *_hierarchical_cp_bad(), ("old-vpp-null", old_run, old_lines)]
    cases += [{**_case(name, run, tmp), "overrides": lines} for name, run, lines in bad]
    cases.append(_case("old-vpp-null/fixed", old_run, tmp))
    answer = bridge_answer(cases, sorted(set(MIXED_PRECISION.values())), timeout=900)
    saved = {case["name"]: Path(case["dump_yaml"]) for case in cases if "dump_yaml" in case}
    return Verdicts(runs, {r["name"]: r for r in answer["results"]}, answer["registered_precisions"], saved)


def _expected(run: RunConfig) -> dict[str, Any]:
    lay, spec = run.layout, run.model
    return {
        "tensor_model_parallel_size": lay.tp,
        "pipeline_model_parallel_size": lay.pp,
        "virtual_pipeline_model_parallel_size": lay.vpp if lay.vpp > 1 else None,
        "context_parallel_size": lay.cp,
        "expert_model_parallel_size": lay.ep,
        "expert_tensor_parallel_size": lay.etp,
        "seq_length": run.options.seq_len,
        "num_layers": spec.num_layers,
        "hidden_size": spec.hidden_size,
        "num_attention_heads": spec.num_attention_heads,
        "num_moe_experts": spec.num_moe_experts,
        "moe_ffn_hidden_size": spec.moe_ffn_hidden_size if spec.is_moe else None,
        "mtp_num_layers": spec.mtp_num_layers or None,
    }


def test_bridge_accepts_every_emitted_plan(bridge: Verdicts) -> None:
    names = [n for name in bridge.runs for n in (name, name + "/yaml")]
    failures = [
        f"{n}: {bridge.results[n].get('stage')}: {bridge.results[n].get('error')}"
        for n in names
        if not bridge.results[n]["ok"]
    ]
    assert not failures, "\n".join(failures)


def test_bridge_derives_lcmoe_layout_and_model(bridge: Verdicts) -> None:
    """Bridge's data-parallel size, parallel sizes, batch and the model it built from the recipe
    (layers, widths, experts) are lcmoe's: the plan's numbers describe the job that starts."""
    for name, run in bridge.runs.items():
        for key in (name, name + "/yaml"):
            got = bridge.results[key]
            assert (got["data_parallel_size"], got["global_batch_size"], got["micro_batch_size"]) == (
                run.layout.dp,
                run.layout.gbs,
                run.layout.mbs,
            ), key
            for field, want in _expected(run).items():
                assert got["model"][field] == want, f"{key}: {field} = {got['model'][field]}, lcmoe {want}"


def test_bridge_trains_the_adapters_lcmoe_planned(bridge: Verdicts) -> None:
    """A LoRA plan starts Bridge's PEFT recipe with lcmoe's rank, targets and input re-gather;
    every other plan trains the whole model."""
    for name, run in bridge.runs.items():
        for key in (name, name + "/yaml"):
            got = bridge.results[key]["peft"]
            if not run.options.is_lora:
                assert got is None, key
                continue
            want = run.options.peft_summary()
            assert want is not None
            assert got == {
                "class": "LoRA",
                "dim": want["rank"],
                "target_modules": want["targets"],
                "sequence_parallel_input_regather": want["input_regather"],
            }, key


def test_recipe_comm_overlap_table_matches_bridge(bridge: Verdicts) -> None:
    """lcmoe writes EP overlap to ``comm_overlap.*`` only for recipes that have that config."""
    for name, run in bridge.runs.items():
        recipe = recipe_for(run.model, run.options)
        assert bridge.results[name]["recipe_has_comm_overlap"] == recipe_has_comm_overlap(recipe), recipe


def test_recipe_mixed_precision_table_matches_bridge(bridge: Verdicts) -> None:
    """lcmoe merges precision fields only into recipes that hold a MixedPrecisionConfig object."""
    holds = {
        recipe_for(run.model, run.options): bridge.results[name]["recipe_mixed_precision_is_object"]
        for name, run in bridge.runs.items()
    }
    wrong = sorted(recipe for recipe, is_object in holds.items() if is_object != keeps_bf16_grad_buffer(recipe))
    assert not wrong, holds


def test_precision_fields_are_bridges_registered_configs(bridge: Verdicts) -> None:
    """The fields lcmoe writes for a precision are those of Bridge's registered config of that name
    (with its default parameter quantization and FP32 gradient reduction)."""
    for precision, name in MIXED_PRECISION.items():
        if precision == "fp16":
            continue  # always written by name
        ours = mixed_precision_fields(TrainingOptions(seq_len=4096, precision=precision))
        theirs = bridge.registered_precisions[name]
        assert {k: theirs[k] for k in ours} == ours, name


def test_bridge_runs_the_precision_and_gradient_buffer_lcmoe_counts(bridge: Verdicts) -> None:
    """After start-up (MixedPrecisionConfig.setup), the DDP gradient buffer is BF16 exactly where
    lcmoe counted one, and the FP8/FP4 recipe and parameter quantization are lcmoe's: every plan
    and every run whose recipe can keep a BF16 buffer (a recipe naming its precision reduces in
    FP32, which the planner counts, ``keeps_bf16_grad_buffer``)."""
    planned = {name for name, _ in _plans()}
    for name, run in bridge.runs.items():
        opt = run.options
        keeps = keeps_bf16_grad_buffer(recipe_for(run.model, opt))
        for key in (name, name + "/yaml"):
            got = bridge.results[key]
            want_fp32 = opt.main_grads_dtype == "fp32" or not keeps
            assert got["ddp_grad_reduce_in_fp32"] == want_fp32, key
            if name in planned:
                assert got["ddp_grad_reduce_in_fp32"] == (opt.main_grads_dtype == "fp32"), key
            if keeps and opt.precision != "fp16":
                fields = mixed_precision_fields(opt)
                assert {k: got["mixed_precision"][k] for k in fields} == fields, key


def test_every_emitted_override_survives_start_up(bridge: Verdicts) -> None:
    """No override lcmoe writes is overwritten by Bridge's or Megatron-Core's start-up (the way a
    registered mixed-precision name overwrote ddp.grad_reduce_in_fp32), and the CUDA graphs that
    run are the planned ones (Megatron-Core 0.19 moves the deprecated scope to modules)."""
    for name, run in bridge.runs.items():
        got = bridge.results[name]
        assert got["changed_overrides"] == {}, (name, got["changed_overrides"])
        scope = run.options.cuda_graph_scope
        if "full_iteration" in scope:
            assert got["cuda_graph"][0] == "full_iteration", name
        elif scope:
            assert got["cuda_graph"] == ["transformer_engine", sorted(scope)], name
        else:
            assert got["cuda_graph"][0] == "none", name


def test_check_reads_the_config_bridge_saves_back_to_the_plan(bridge: Verdicts) -> None:
    """``lcmoe check`` on the resolved config Bridge writes at start-up (logger.save_config_filepath,
    Megatron-Core 0.19 field names: cuda_graph_modules, cuda_graph_impl=full_iteration) finds the
    planned layout and options, but for what a CPU stand-in changed."""
    from lcmoe.catalog import read_yaml_text
    from lcmoe.config_io.bridge import flatten

    for name, run in bridge.runs.items():
        stand_ins = " ".join(bridge.results[name]["cpu_stand_ins"])
        values = flatten(read_yaml_text(bridge.saved_configs[name].read_text(), origin=name))
        back = run_from_overrides(values, model=run.model, hardware=run.hardware, num_gpus=run.layout.world_size)
        assert back.layout == run.layout, name
        ignored = {"fp8_param_gather"}  # compared as quantized_params: None means the recipe's default
        if "use_precision_aware_optimizer" in stand_ins:
            ignored |= {"precision_aware", "exp_avg_dtype", "main_params_dtype"}
        if "moe_token_dispatcher_type" in stand_ins:
            ignored.add("dispatcher")
        offline = run.options.peft != "none" and values.get("dataset.enable_offline_packing") is True
        if run.options.doc_lengths is not None or offline:
            # The saved config says that documents are packed, not their lengths (those live in
            # plan.json or --doc-lengths): check reads packed documents of unknown length. A
            # finetune recipe's SFT dataset packs offline (packed SQuAD) without --doc-lengths too.
            assert back.options.doc_lengths is not None and back.options.doc_lengths.name == "unknown", name
            ignored.add("doc_lengths")
        # A recipe naming its precision reduces in FP32 (the planner counts that; these hand-made
        # feature runs may not).
        keeps = keeps_bf16_grad_buffer(recipe_for(run.model, run.options))
        want = replace(run.options, main_grads_dtype=run.options.main_grads_dtype if keeps else "fp32")
        for field in set(TrainingOptions.__dataclass_fields__) - ignored:
            assert getattr(back.options, field) == getattr(want, field), (name, field)
        assert back.options.quantized_params == run.options.quantized_params, name


def test_bridge_and_lcmoe_refuse_the_same_layouts(bridge: Verdicts) -> None:
    for name, run, _ in _known_bad():
        assert not bridge.results[name]["ok"], f"Bridge accepted {name}"
        assert violations(run), f"lcmoe accepted {name}; Bridge said {bridge.results[name]['error']}"
    assert "divisible by 2 * context parallel" in bridge.results["seq-not-multiple-of-2cp"]["error"]


def test_vpp_stays_explicit_next_to_a_layout(bridge: Verdicts) -> None:
    """Regression: a layout with VPP left to inference fails Bridge's EP-overlap setup."""
    old, fixed = bridge.results["old-vpp-null"], bridge.results["old-vpp-null/fixed"]
    assert not old["ok"]
    assert "virtual_pipeline_model_parallel_size must be specified" in old["error"]
    assert fixed["ok"], fixed.get("error")


def test_bridge_runs_the_hierarchical_cp_lcmoe_plans(bridge: Verdicts) -> None:
    """Bridge's _validate_cp_comm_type (config.py:1526-1557) accepts the emitted a2a+p2p plans, and
    refuses a2a+p2p without sizes and sizes whose product is not CP, as lcmoe does."""
    for name, _ in _hierarchical_cp_runs():
        for case in (name, name + "/yaml"):
            assert bridge.results[case]["ok"], (case, bridge.results[case].get("error"))
    missing, wrong = bridge.results["hcp-without-sizes"], bridge.results["hcp-product-not-cp"]
    assert not missing["ok"] and "hierarchical_context_parallel_sizes must be set" in missing["error"]
    assert not wrong["ok"] and "must equal context_parallel_size" in wrong["error"]
    (_, no_sizes, _), (_, good, lines) = _hierarchical_cp_bad()
    assert "L-CP-HIER-SIZES" in {v.rule for v in violations(no_sizes)}
    with pytest.raises(LcmoeError, match="multiply to 32, not CP = 16"):
        run_from_overrides(
            parse_override_lines("\n".join(lines)), model=good.model, hardware=good.hardware, num_gpus=64
        )
