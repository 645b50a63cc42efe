"""A batch's Spark jobs named by the pipeline, the batch and the stage that ran them.

Each stage of a pipeline run (:data:`STAGES`) runs its Spark jobs in a job group of its
own, ``watermark:<pipeline>:<batch>:<stage>``, whose description the Spark UI shows beside
every job (Delta puts its own step after it: ``...:write: MERGE: Compute snapshot``). A
user's job group is put back when the stage ends. Tests count a stage's jobs by its group
(:func:`stage_group`), which is how a batch's Spark work is held to a budget without a
timing. A Spark Connect session, which has no job groups, tags its jobs with the same name
(``watermark-<stage>`` without the batch, as tags allow no colon).
"""

import contextlib
from collections.abc import Iterator
from typing import Final

from pyspark.sql import SparkSession

# The stages of a pipeline run, in order: pin and bind the inputs (the log only), build the
# transform (the touched keys' collects), write the target (the output's evaluation, its
# summary and the MERGE), and record what the run did.
STAGES: Final = ("bind", "transform", "write", "record")

_GROUP: Final = "spark.jobGroup.id"
_DESCRIPTION: Final = "spark.job.description"
_INTERRUPT: Final = "spark.job.interruptOnCancel"


def stage_group(pipeline: str, batch_id: str, stage: str) -> str:
    """The job group of ``stage`` of ``pipeline``'s run on ``batch_id``."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; the stages are {STAGES}")
    return f"watermark:{pipeline}:{batch_id}:{stage}"


@contextlib.contextmanager
def spark_stage(spark: SparkSession, pipeline: str, batch_id: str, stage: str) -> Iterator[None]:
    """Run the block's Spark jobs in ``stage``'s job group (:func:`stage_group`), then put
    back the job group and description the thread had."""
    group = stage_group(pipeline, batch_id, stage)
    if getattr(spark, "_jvm", None) is None:  # Spark Connect: tags instead of groups
        tag = f"watermark-{stage}"
        spark.addTag(tag)
        try:
            yield
        finally:
            spark.removeTag(tag)
        return
    context = spark.sparkContext
    previous = {key: context.getLocalProperty(key) for key in (_GROUP, _DESCRIPTION, _INTERRUPT)}
    context.setJobGroup(group, group)
    try:
        yield
    finally:
        for key, value in previous.items():
            # A property the thread did not have is removed (the JVM's null).
            context.setLocalProperty(key, value)  # pyright: ignore[reportArgumentType]
