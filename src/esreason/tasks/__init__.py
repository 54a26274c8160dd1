"""Tasks: loaders, prompt rendering and verifiers by name (see :mod:`esreason.tasks.registry`)."""

from esreason.tasks.base import Problem, RenderedPrompts, Task, problem_prompt, render_prompt
from esreason.tasks.registry import SUITES, add_tasks_dir, get, names, register, resolve, suite

__all__ = ["Problem", "RenderedPrompts", "SUITES", "Task", "add_tasks_dir", "get", "names", "problem_prompt", "register",
           "render_prompt", "resolve", "suite"]
