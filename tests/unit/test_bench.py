"""Pure parts of `qwenquant bench`: SSE framing, the rate arithmetic, Prometheus parsing, configurations,
the ladder, nvidia-smi samples."""

from __future__ import annotations

import pytest

from qwenquant.bench.gpu import parse_samples, summarize
from qwenquant.bench.launch import ConfigSpec
from qwenquant.bench.metrics import acceptance
from qwenquant.bench.rates import ratio_spread, sample_figures
from qwenquant.bench.stream import Sample, read_stream, sse_events
from qwenquant.bench.workload import ladder, load_config, plan_cells, request_body
from qwenquant.errors import BenchError, UsageError
from qwenquant.net.prometheus import spec_counters


def _lines(raw: bytes) -> list[tuple[bytes, float]]:
    return [(line, float(i)) for i, line in enumerate(raw.splitlines(keepends=True))]


def test_sse_framing_crlf_comments_and_multiline_data() -> None:
    raw = b': keep-alive\r\ndata: {"a":\r\ndata: 1}\r\n\r\nevent: x\ndata:[DONE]\n\n'
    assert list(sse_events(_lines(raw))) == [('{"a":\n1}', 1.0), ("[DONE]", 5.0)]


def test_first_token_is_the_first_text_in_any_field_and_usage_is_required() -> None:
    ev = [
        ('{"choices":[{"delta":{"role":"assistant","content":""}}]}', 1.0),
        ('{"choices":[{"delta":{}}]}', 2.0),
        ('{"choices":[{"delta":{"reasoning":"hm"}}]}', 3.0),
        ('{"choices":[{"delta":{"content":"ok"},"finish_reason":"length"}]}', 4.0),
        ('{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":5}}', 4.5),
        ("[DONE]", 5.0),
    ]
    s = read_stream(ev, 0.0, 5)
    assert (s.t_first, s.first_field, s.t_end, s.completion_tokens, s.short) == (3.0, "reasoning", 5.0, 5, False)
    assert s.text_events == 2
    with pytest.raises(BenchError, match="no token usage"):
        read_stream(ev[:4] + ev[5:], 0.0, 5)
    with pytest.raises(BenchError, match="error mid-stream"):
        read_stream([('{"error":{"message":"boom"}}', 1.0)], 0.0, 5)


def test_both_denominators() -> None:
    s = Sample(
        t_sent=10.0,
        t_first=10.5,
        t_end=12.5,
        prompt_tokens=100,
        completion_tokens=41,
        max_tokens=41,
        first_field="content",
    )
    f = sample_figures(s)
    assert f == {"wall_tok_s": 41 / 2.5, "decode_tok_s": 40 / 2.0, "ttft_s": 0.5, "prefill_tok_s": 200.0}
    assert ratio_spread([2.0, 3.0, None], [1.0, 1.0, 1.0]).as_dict() == {"median": 2.5, "min": 2.0, "max": 3.0, "n": 2}


METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="a,b\\"c}"} 10.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 10.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e+09
vllm:spec_decode_num_draft_tokens{engine="0"} 60
vllm:spec_decode_num_accepted_tokens_total{engine="0"} 30 1700000000000
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="1"} 8
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 16
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",position="0"} 2
garbage line
"""


def test_acceptance_from_metrics_deltas() -> None:
    after = spec_counters(METRICS)
    assert (after.drafts, after.draft_tokens, after.accepted, after.per_pos) == (20.0, 60.0, 30.0, {0: 18.0, 1: 8.0})
    a = acceptance(after.minus(spec_counters("")))
    assert a["mean_acceptance_length"] == 2.5 and a["per_position"] == [0.9, 0.4] and a["acceptance_rate"] == 0.5
    assert acceptance(after.minus(after))["speculative"] is False
    assert acceptance(spec_counters("vllm:num_requests_running 0\n")).to_json() == {
        "metrics_page": True,
        "speculative": False,
        "counters": False,
    }


def test_configurations_are_typed() -> None:
    """A configuration is built from typed options, never parsed from a string; the report records it as options."""
    c = ConfigSpec("off", profile="single-user", gpu_mem="24GiB", extra=("--speculative-config", "null"))
    assert c.text == "--profile single-user --gpu-mem 24GiB -- --speculative-config null"
    assert ConfigSpec("A", url="http://h:1").text == "--url http://h:1"
    with pytest.raises(UsageError, match="names a URL and serve options"):
        ConfigSpec("A", url="http://h:1", profile="batch")


def test_ladder_and_cells() -> None:
    assert ladder(1) == [1] and ladder(16) == [1, 2, 4, 8, 16] and ladder(6) == [1, 2, 4, 6]
    cfg = load_config()
    assert set(cfg.prompts) == {"narrative", "code", "quote"}
    cells, steps = plan_cells(cfg, ["code", "quote"], ["greedy", "sampled"], [False, True], 4)
    assert [c.key for c in steps] == [
        "code/greedy/think-off/c1",
        "code/greedy/think-off/c2",
        "code/greedy/think-off/c4",
    ]
    assert len(cells) == 2 * 2 * 2 + 2 and steps[0] in cells
    with pytest.raises(UsageError, match="unknown prompt poem"):
        plan_cells(cfg, ["poem"], ["greedy"], [None], 1)


def test_nvidia_smi_samples_flag_throttling() -> None:
    text = (
        "2026/11/30 10:00:00.000, 0, NVIDIA H200, 1980, 1980, 650.1, 700.00, 60, 0x0000000000000000\n"
        "2026/11/30 10:00:00.200, 0, NVIDIA H200, 1500, 1980, 699.9, 700.00, 61, 0x0000000000000004\n"
        "2026/11/30 10:00:00.400, 0, NVIDIA H200, 1980, 1980, [N/A], 700.00, 61, 0x0000000000000001\n"
    )
    s = summarize(parse_samples(text))
    assert s["throttled"] and s["throttle_reasons"] == {"sw_power_cap": 1} and s["sm_mhz"]["min"] == 1500
    assert s["throttled_fraction"] == pytest.approx(1 / 3) and s["gpu_name"] == "NVIDIA H200"
    assert summarize([])["sampled"] is False


def test_a_run_request_asks_for_token_ids_so_usage_is_checked_exactly() -> None:
    """With MTP a chunk carries several tokens: without vLLM's token ids the streamed count is a floor
    (chunks), and usage could not be held against it (seen on CUDA vLLM 0.26: 91 chunks for 256 tokens)."""

    cfg = load_config()
    cells, _ = plan_cells(cfg, ["code"], ["greedy"], [True], 1)
    body = request_body(cfg, "m", cells[0], max_tokens=16, ignore_eos=True)
    assert body["return_token_ids"] is True and body["ignore_eos"] is True
    assert body["chat_template_kwargs"] == {"enable_thinking": True} and body["max_tokens"] == 16
