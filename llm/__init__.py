"""What the language models need beside model.py and lora.py (the root's core files); nothing here
imports grisp/, grasp/ or web/.

    tokenizer.py      tokenizer.json with Qwen's special ids; the chat prompt format (with and without tools)
    prompt_cache.py   reuse of a prompt's shared start (its KV cache)
    cpu_speed.py      CPU levers: split matmuls, int8; the precision each CPU gets (native bf16 or float32)
    encoder.py        all-MiniLM-L6-v2 sentence encoder in plain PyTorch (search.py's property index)
    gguf_convert.py   qwen2 GGUF -> Hugging Face Qwen2 directory (get_model.py's offline path)
"""
