"""The policy: model and tokenizer loading, the generation backends, memory planning.

How the package is organized (one module per job):

====================  ============================================================================================
module                owns
====================  ============================================================================================
``loading.py``        loading a causal LM and its tokenizer (the embedded default included); :class:`Policy`
``decode.py``         :class:`DecodeEngine`: batched decoding with KV-prefix sharing (a ``rollout`` segment engine)
``kv_cache.py``       :class:`KVBatch` (the engine's KV-cache rows) and the row operations on it (select, concat, fork)
``sampling.py``       sampling one token (temperature, top-k, top-p; behaviour log-prob) and the repetition stop
``vllm_backend.py``   vLLM and the HF reference as segment-request backends (optional extra ``gpu``)
``backends.py``       backend selection and construction (``make_generation_backend``), ``sync_weights``
``memory.py``         the memory planner (micro-batch and decode-row sizes for the device)
``threads.py``        torch's intra-op CPU threads for the machine
``embedded*/``        the embedded default models (data)
====================  ============================================================================================

The engines implement the interfaces of ``rollout/`` (``rollout/engine.py``, ``rollout/generate.py``); the
sampling driver itself lives in ``rollout/generate.py``.
"""
