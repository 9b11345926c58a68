"""The helpers every part of the project shares, below everything else (they import nothing of it):

defaults.py      the default locations (GRISP_HOME, model, indices, data) and the --help format
jsonl.py         the JSONL reader and writer, atomic writes
code_version.py  the fingerprint of the sources a result comes from
"""
