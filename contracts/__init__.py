"""Shared contracts of every layer: the user-error type, the strict config base and the one hashing
rule (``contracts.common``), and every on-disk format: Parquet schemas and the dataset manifest
(``contracts.schema``).

The bottom of the import graph (flows -> evaluation -> bert_core -> data_jobs -> contracts): it imports
nothing of the project and neither torch nor Ray, so Ray workers, model code and the CLI load it cheaply.
"""
