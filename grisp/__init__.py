"""GRISP's library: the pipeline and everything it is made of (the stage scripts at the root use it;
the search indices are the root's search.py, the model's machinery llm/).

    pipeline.py      question -> skeletons -> resolution -> first valid query (the Grisp class)
    options.py       the one set of switches and knobs (ablations) every stage derives its flags from
    stage 1, skeletons:   prompts.py, generate.py (beam search), skeleton.py (placeholders; gold query -> skeleton)
    stage 2, resolution:  resolve.py (depth-first search), positions.py, constraints.py, rerank.py, tracing.py
    the knowledge graph:  sparql.py (HTTP client), sparql_syntax.py (tokenizer, prefixes)
    the index build:      endpoint_items.py (paged endpoint reader), wikidata_dump.py (the JSON dump),
                          dump_stores.py (a dump's item stores in parts, resumable),
                          prefix_build.py (chunked, resumable prefix index in a memory budget)
    training:             samples.py, compose.py, mixture.py, loss.py, trainer.py (train.py's loop and resume),
                          train_config.py (train.py's flags, defined once), checkpoint.py, peft_format.py
                          (adapters on disk)
    evaluation:           benchmarks.py, metrics.py, skeleton_score.py, coverage.py (precision and declining),
                          confidence.py (an answer's confidence; declining below --min-confidence)
The helpers every part shares (default locations, JSONL files, the code fingerprint, sorted runs on disk)
are in common/. The index builds' parts: prefix_build.py (the chunked prefix index), wikidata_dump.py and
dump_stores.py (the Wikidata JSON dump), endpoint_items.py (items from a SPARQL endpoint, paged).
"""
