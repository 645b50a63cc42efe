"""Observing upstreams without a JVM: the Delta log reader (:mod:`.log`), the observer
(:mod:`.observer`) and the retention horizon (:mod:`.retention`)."""
