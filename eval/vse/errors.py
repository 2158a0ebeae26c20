"""The suite's exceptions. Each carries one line a user can act on; the CLI prints it and
maps the class to an exit code (2: the run itself failed; 1 is reserved for failed gates)."""


class SuiteError(Exception):
    """A failure that ends the run with one clear line (exit code 2)."""


class DamagedRunError(SuiteError):
    """A run directory whose files contradict each other or cannot be read: refused, file named."""


class ScenarioError(SuiteError):
    """The scenario file is wrong: names the file, the key path and the problem."""


class PreflightError(SuiteError):
    """Refused before any server start (GPU capability, port, model path, GPU count)."""


class ServerError(SuiteError):
    """A vLLM server died, did not become healthy, or selected the wrong kernel."""


class KernelMismatchError(ServerError):
    """vLLM selected a different FP8 kernel from the one the arm asked for."""


class DevicesBusyError(PreflightError):
    """Another comparison held this machine's devices for the whole wait: exit 5, which CI retries."""


class UnsupportedError(PreflightError):
    """This machine cannot run the configuration at all (a backend's GPU generation, a GPU
    count): exit 4, which CI may treat as 'not applicable here' without hiding crashes."""


def tail(text: str, limit: int = 2000) -> str:
    """The end of a long output, for a message: whole lines, at most `limit` characters; the last
    line alone when it is longer, cut after a space and marked. Never a word cut in half."""
    kept: list[str] = []
    size = 0
    for line in reversed(text.rstrip().splitlines()):
        if kept and size + len(line) + 1 > limit:
            break
        kept.append(line)
        size += len(line) + 1
    if kept and len(kept[0]) > limit:  # the last line alone is too long
        cut = kept[0][-limit:]
        kept[0] = "..." + (cut[cut.index(" ") + 1 :] if " " in cut else cut)
    return "\n".join(reversed(kept))
