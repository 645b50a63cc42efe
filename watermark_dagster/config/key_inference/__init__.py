"""Key inference for declared SQL: the key paths a declared query proves
(:mod:`~watermark_dagster.config.key_inference.inference`), from the equalities of its
scopes (:mod:`~watermark_dagster.config.key_inference._scopes`).
"""
