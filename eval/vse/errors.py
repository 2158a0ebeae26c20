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


class UnsupportedError(PreflightError):
    """This machine cannot run the configuration at all (a backend's GPU generation, a GPU
    count): exit 4, which CI may treat as 'not applicable here' without hiding crashes."""
