"""What a vLLM server inherits from the caller's environment: an allow-list, never the whole of it."""

from __future__ import annotations

# What a server inherits from the caller's environment, and why: finding programs and libraries,
# locale and temporary files; the GPUs it may use; vLLM's, torch's, NCCL's, FlashInfer's and the
# hub's own settings (log level, caches, offline mode, a token for gated models); OpenBLAS's and
# OpenMP's (some CPUs need OPENBLAS_CORETYPE); TLS trust and proxies for a hub download.
# Nothing else passes: a stray variable in the caller's shell cannot change what a server does
# (VLLM_API_KEY made servers demand a key the client never sent: every request 401).
INHERITED = {"PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR", "PYTHONPATH", "PYTHONHASHSEED",
             "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
             "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"}  # fmt: skip
INHERITED_PREFIXES = ("LC_", "LD_", "XDG_", "CUDA_", "NVIDIA_", "NCCL_", "NVSHMEM_", "VLLM_", "TORCH", "PYTORCH_",
                      "TRITON_", "FLASHINFER_", "HF_", "HUGGING_FACE_", "TRANSFORMERS_", "OMP_", "GOMP_", "MKL_", "KMP_",
                      "OPENBLAS_")  # fmt: skip
NEVER_INHERITED = {"VLLM_API_KEY"}  # a key reaches a server only through server.api_key_env


def inherited_env(environ) -> dict[str, str]:
    """The part of the caller's environment a server inherits (INHERITED, INHERITED_PREFIXES)."""
    return {
        k: v
        for k, v in environ.items()
        if k not in NEVER_INHERITED and (k in INHERITED or k.startswith(INHERITED_PREFIXES))
    }
