"""What a vLLM server inherits from the caller's environment: an allow-list, never the whole of it."""

from __future__ import annotations

# What a server inherits from the caller's environment, and why: finding programs and libraries,
# locale and temporary files; the GPUs it may use; vLLM's, torch's, NCCL's, FlashInfer's and the
# hub's own settings (log level, caches, offline mode, a token for gated models); the math
# libraries' (OpenMP, MKL, OpenBLAS, NVPL, oneDNN: some machines pin a BLAS's CPU type, and the
# kernels it picks decide whether two batch sizes give the same greedy outputs); Python's own
# (PYTHONPATH, PYTHONUNBUFFERED: a server's log is read while it runs); TLS trust and proxies.
# Nothing else passes: a stray variable in the caller's shell cannot change what a server does
# (VLLM_API_KEY made servers demand a key the client never sent: every request 401).
INHERITED = {"PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR",
             "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
             "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"}  # fmt: skip
INHERITED_PREFIXES = ("LC_", "LD_", "XDG_", "CUDA_", "NVIDIA_", "NCCL_", "NVSHMEM_", "VLLM_", "TORCH", "PYTORCH_",
                      "TRITON_", "FLASHINFER_", "HF_", "HUGGING_FACE_", "TRANSFORMERS_", "OMP_", "GOMP_", "MKL_", "KMP_",
                      "OPENBLAS_", "NVPL_", "BLIS_", "DNNL_", "ONEDNN_", "PYTHON")  # fmt: skip
NEVER_INHERITED = {"VLLM_API_KEY"}  # a key reaches a server only through server.api_key_env


def inherited_env(environ) -> dict[str, str]:
    """The part of the caller's environment a server inherits (INHERITED, INHERITED_PREFIXES)."""
    return {
        k: v
        for k, v in environ.items()
        if k not in NEVER_INHERITED and (k in INHERITED or k.startswith(INHERITED_PREFIXES))
    }
