"""Cut the first SECONDS of a Mooncake-format trace, line by line and unchanged (the window
eval/vse/data/mooncake/ ships): python3 benchmarks/cut_trace.py TRACE.jsonl SECONDS > window.jsonl"""

import json
import sys


def main(path: str, seconds: float) -> None:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if json.loads(line)["timestamp"] >= seconds * 1000:
                break
            sys.stdout.write(line if line.endswith("\n") else line + "\n")


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
