import json

from conftest import needs_tokenizer

from vse.loadgen.datasets import build_prompts, load_prompts, load_tokenizer, save_prompts
from vse.scenario import DatasetSpec


@needs_tokenizer
def test_random_prompts_have_exact_length_after_retokenization(tokenizer_dir):
    spec = DatasetSpec(input_len=200, output_len=50, seed=3)
    prompts = build_prompts(spec, 30, tokenizer_dir)
    tok = load_tokenizer(tokenizer_dir)
    for p in prompts:
        assert len(tok.encode(p.text, add_special_tokens=False).ids) == 200 == p.prompt_len
        assert p.output_len == 50


@needs_tokenizer
def test_range_ratio_and_shared_prefix(tokenizer_dir):
    spec = DatasetSpec(input_len=100, output_len=40, range_ratio=0.5, prefix_len=32, seed=1)
    prompts = build_prompts(spec, 40, tokenizer_dir)
    lens = [p.prompt_len for p in prompts]
    assert min(lens) >= 32 + 50 and max(lens) <= 32 + 150 and len(set(lens)) > 5
    assert all(20 <= p.output_len <= 60 for p in prompts)
    tok = load_tokenizer(tokenizer_dir)
    heads = {tuple(tok.encode(p.text, add_special_tokens=False).ids[:24]) for p in prompts}
    assert len(heads) == 1  # the shared prefix survives re-tokenization


@needs_tokenizer
def test_same_seed_same_bytes_different_seed_different(tokenizer_dir, tmp_path):
    spec = DatasetSpec(input_len=64, output_len=8, seed=5)
    a = save_prompts(tmp_path / "a.jsonl", build_prompts(spec, 10, tokenizer_dir))
    b = save_prompts(tmp_path / "b.jsonl", build_prompts(spec, 10, tokenizer_dir))
    assert a == b and (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    c = save_prompts(tmp_path / "c.jsonl", build_prompts(spec.model_copy(update={"seed": 6}), 10, tokenizer_dir))
    assert c != a
    assert load_prompts(tmp_path / "a.jsonl") == build_prompts(spec, 10, tokenizer_dir)


@needs_tokenizer
def test_sharegpt_and_jsonl(tokenizer_dir, tmp_path):
    conv = [
        {
            "conversations": [
                {"from": "human", "value": f"Tell me about topic number {i} in detail please"},
                {"from": "gpt", "value": "Sure. " * (5 + i)},
            ]
        }
        for i in range(5)
    ]
    conv.append({"conversations": [{"from": "human", "value": "hi"}]})  # filtered: no reply
    (tmp_path / "sg.json").write_text(json.dumps(conv))
    ps = build_prompts(DatasetSpec(kind="sharegpt", path=str(tmp_path / "sg.json")), 5, tokenizer_dir)
    assert len(ps) == 5 and all(p.output_len >= 5 for p in ps)
    (tmp_path / "p.jsonl").write_text('{"prompt": "a b c", "output_len": 7}\n{"prompt": "d e"}\n')
    ps = build_prompts(DatasetSpec(kind="jsonl", path=str(tmp_path / "p.jsonl"), output_len=9), 4, tokenizer_dir)
    assert [p.output_len for p in ps] == [7, 9, 7, 9] and [p.index for p in ps] == [0, 1, 2, 3]
