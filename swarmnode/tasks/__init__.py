"""Task sources (reasoning-gym, JSONL), TaskRef, verifiers and the task mix.

Public API::

    TaskRef, Task, TaskSource, config_digest          # shared contract (base.py)
    ReasoningGymSource(name, config, size, max_answer_share=None)  # rg:<name> (balance: tasks/balance.py)
    JsonlSource(path, name=None), JsonlFormatError    # jsonl:<sha256>
    TaskMix(sources, weights, ...), TaskMix.from_config(cfg.tasks, base_dir)
    # TaskMix: mix.py (stream, seeds), heldout.py (held-out set), reward.py (scoring), sources.py (from config)
    extract_answer, format_reward, math_verify_score  # verifiers (never raise)

Modules: ``base.py`` (the task contract), ``reasoning_gym_source.py`` and ``jsonl_source.py`` (the two kinds of
source), ``balance.py`` (answer balance), ``partition.py`` (the train / held-out partition by question content),
``mix.py``, ``heldout.py``, ``reward.py`` and ``sources.py`` (the task mix), ``verifiers.py`` (rewards),
``steps.py`` (program checks of reasoning lines), ``solutions.py`` (worked solutions for the embedded models'
build), ``curriculum.py`` (the swarm curriculum's votes and weights).
"""

from swarmnode.tasks.base import Task, TaskRef, TaskSource, config_digest
from swarmnode.tasks.jsonl_source import JsonlFormatError, JsonlSource
from swarmnode.tasks.mix import TaskMix
from swarmnode.tasks.reasoning_gym_source import ReasoningGymSource
from swarmnode.tasks.verifiers import extract_answer, format_reward, math_verify_score

__all__ = [
    "Task",
    "TaskRef",
    "TaskSource",
    "config_digest",
    "ReasoningGymSource",
    "JsonlSource",
    "JsonlFormatError",
    "TaskMix",
    "extract_answer",
    "format_reward",
    "math_verify_score",
]
