"""Packed sequences (``ModelConfig.doc_tokens``): SFT and LoRA datasets are packed to the sequence length and the
engines' variable-length fused kernels attend within each document (Transformer Engine's THD format with
cu_seqlens, Megatron-LM's --dataloader-inter-document-masking, torchtitan's block-causal masks), so attention costs
documents, not the sequence; every other op costs the whole sequence."""

import json

import pytest

from symtensor import api
from symtensor.cli import main
from symtensor.errors import PlanError
from symtensor.export import export
from symtensor.graph import op_fwd_flops
from symtensor.models import build_graph, load_model_config
from symtensor.plan import load_plan, save_plan

SEQ, DOC = 32768, 2048


def attention_flops(cfg, seq):
    """Forward FLOPs of one sequence's attention over every layer."""
    graph = build_graph(cfg, micro_batch=1, seq=seq, skeleton=True)
    return sum(op_fwd_flops(op) * graph.meta["repeat"][op.layer] for op in graph.ops if op.kind == "attention")


def test_causal_attention_within_documents_does_the_documents_work():
    """A causal query sees half its document on average: t * d / 2 pairs per sequence against t^2 / 2, so the
    attention's FLOPs scale by d / t; documents as long as the sequence change nothing."""
    cfg = load_model_config("llama3-8b")
    whole = attention_flops(cfg, SEQ)
    assert attention_flops(cfg.replace(doc_tokens=DOC), SEQ) == pytest.approx(whole * DOC / SEQ, rel=1e-3)
    assert attention_flops(cfg.replace(doc_tokens=SEQ), SEQ) == whole
    assert attention_flops(cfg.replace(doc_tokens=4 * SEQ), SEQ) == whole


def test_packed_documents_make_attention_cheaper_and_nothing_else():
    """Llama 3 8B at 32K tokens on 64 H100 (TP 2 x CP 2): documents of 2K tokens cut the attention's FLOPs 16x and
    the step by what attention cost; the model's other FLOPs, the memory and the communication are unchanged."""
    kw = dict(tp=2, cp=2, zero=1, seq=SEQ, global_batch=64)
    whole = api.evaluate("llama3-8b", "dgx-h100", 64, **kw)
    packed = api.evaluate("llama3-8b", "dgx-h100", 64, overrides={"doc_tokens": DOC}, **kw)
    cfg = load_model_config("llama3-8b")
    saved = attention_flops(cfg, SEQ) - attention_flops(cfg.replace(doc_tokens=DOC), SEQ)
    # (the model's FLOPs count backward as twice forward, Megatron's convention: three forwards per sequence)
    assert whole.report.model_flops - packed.report.model_flops == pytest.approx(3 * saved * kw["global_batch"])
    assert packed.report.step_time_s < 0.75 * whole.report.step_time_s
    assert packed.report.memory_reserved == whole.report.memory_reserved
    assert packed.report.breakdown["tp_comm"] == whole.report.breakdown["tp_comm"]
    assert packed.report.comm_bytes == whole.report.comm_bytes


def test_the_prediction_says_it_assumed_packed_documents(tmp_path, capsys):
    """evaluate, plan and explain name the assumption; a plan file keeps it (its model's doc_tokens), so explain and
    the exports read the same costing."""
    assert main(["evaluate", "llama3-8b", "--cluster", "dgx-h100", "--devices", "8", "--seq", "8192", "--set",
                 f"doc_tokens={DOC}", "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any(n.startswith("packed sequences: attention costed per document of 2,048 tokens") for n in notes)
    plan = api.plan("llama3-8b", "dgx-h100", 8, seq=8192, overrides={"doc_tokens": DOC})
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    again = load_plan(path)
    assert again.model.doc_tokens == DOC
    assert again.report.step_time_s == pytest.approx(plan.report.step_time_s, rel=1e-9)
    from symtensor.analysis.explain import explain_plan
    assert explain_plan(again)["assumptions"][0].startswith("packed sequences: attention costed per document")
    assert "assumptions" not in explain_plan(api.plan("llama3-8b", "dgx-h100", 8, seq=8192, global_batch=64))
    assert "--dataloader-inter-document-masking" in export(again, "megatron")
    assert "block-causally" in export(again, "torchtitan")["_packing_note"]
    assert "--dataloader-inter-document-masking" not in export(api.plan("llama3-8b", "dgx-h100", 8, seq=8192),
                                                                "megatron")


@pytest.mark.parametrize("value,message", [("-1", "doc_tokens must be"), ("2.5", "doc_tokens")])
def test_a_bad_document_length_is_one_clear_line(value, message, capsys):
    assert main(["evaluate", "llama3-8b", "--cluster", "dgx-h100", "--devices", "8", "--set",
                 f"doc_tokens={value}"]) != 0
    err = capsys.readouterr().err.strip()
    assert message in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_what_cannot_run_packed_documents_says_so():
    """Unfused attention materialises the whole sequence's scores (masked, not skipped); the runtime's model and
    Hugging Face's plain configs have no per-document attention."""
    cfg = load_model_config("llama3-8b")
    with pytest.raises(PlanError, match="doc_tokens need attention=flash"):
        cfg.replace(attention="unfused", doc_tokens=DOC)
    from symtensor.runtime.torch_models import check_supported
    with pytest.raises(PlanError, match="packed documents"):
        check_supported(load_model_config("tiny-llama").replace(doc_tokens=8))
