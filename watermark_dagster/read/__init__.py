"""Reading a batch's pinned inputs with Spark: the preflight checks (:mod:`.preflight`),
one reader per read mode (:mod:`.cdf`, :mod:`.appended`, :mod:`.snapshot`,
:mod:`.cursor`) and the input that binds them (:mod:`.inputs`)."""
