"""A Hydra launcher that runs each server group as a Ray task (``hydra/launcher=ray``).

Our sweeper plans the grid into server groups and hands them to this launcher as an executor
(:class:`pipeline.run.outcomes.Executor`): each group is resolved, then run, in a Ray task with
its own resource request, through :mod:`pipeline.run.worker`. The group travels as the task's
argument, a frozen record Ray serializes once; the worker never re-enters the command line or
this plugin. Hydra's own ``launch`` (one job per composed config) is not how a sweep runs.

Why not hydra-ray-launcher: it pins cloudpickle<3, pulls in boto3, shrinks the object store and
waits forever on a resource request the cluster can never meet. Here the request is checked
against the cluster first, a dead address fails within a deadline, and on a machine without
GPUs the groups run one at a time, so two servers never share the cores being measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from pipeline.config import RayConfig
from pipeline.run.plumbing import cluster
from pipeline.run.progress import ray_hub

if TYPE_CHECKING:  # the driver's records import MLflow: not on every command line
    from pipeline.run.outcomes import GroupOutcome, GroupTask
    from pipeline.run.resolve import Resolved

# After Ctrl-C, how long a cancelled task gets to stop its server before we give up on it.
CANCEL_GRACE_S = 60.0
# A group whose worker or node died is run again (Ray's system-failure retries; an error in the
# group itself is not retried). The new attempt keeps what the lost one finished (pipeline.run.group).
GROUP_RETRIES = 3


class SpecsweepRayLauncher(Launcher):
    def __init__(self) -> None:
        self.config: DictConfig | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        raise NotImplementedError(
            "hydra/launcher=ray runs specsweep's server groups, planned by its sweeper (hydra/sweeper=specsweep)"
        )

    @property
    def out_dir(self) -> Path:
        # Ray workers run in a temporary folder: every path they get must be absolute.
        assert self.config is not None
        return Path(str(self.config.hydra.sweep.dir)).resolve()

    def _ray_config(self) -> RayConfig:
        assert self.config is not None
        values = OmegaConf.to_container(self.config.get("ray") or {}, resolve=True)
        assert isinstance(values, dict)
        return RayConfig(**values)

    def _requests(self, tasks: Sequence[GroupTask], config: RayConfig) -> list[dict[str, Any]]:
        """Each group's resource request: its server's GPUs (engine.device=auto asks for them where
        the cluster has GPUs), on one node; Ray's resources decide where, not the driver's."""
        from pipeline.run.resolve import server_gpus

        gpus_present = any(g > 0 for g in cluster.node_gpus())
        return [cluster.group_request(config, server_gpus(t.group.server_job.engine, gpus_present)) for t in tasks]

    def preflight(self, tasks: Sequence[GroupTask]) -> None:
        """Called by the driver before any server starts; raises LaunchError."""
        import ray

        config = self._ray_config()
        cluster.connect(config)
        if config.resources_per_group:
            cluster.check_resources(config.resources_per_group, cluster.node_resources())
        else:
            requests = self._requests(tasks, config)
            needs = [cluster.Need(t.group.label, int(r["num_gpus"])) for t, r in zip(tasks, requests, strict=True)]
            cluster.check_feasible(needs, ray.cluster_resources(), cluster.node_gpus())
        if tasks:
            cluster.check_store(tasks[0].store.tracking_uri, len(cluster.node_gpus()), cluster.node_hosts())

    def resolve(self, tasks: Sequence[GroupTask]) -> dict[int, Resolved]:
        """Each group resolved in a task with its own request, so on a node of the kind it gets."""
        import ray

        from pipeline.run.worker import resolve_task

        config = self._ray_config()
        remote = ray.remote(resolve_task)
        refs = [
            remote.options(**request).remote(t.group, t.settings.verbose)
            for t, request in zip(tasks, self._requests(tasks, config), strict=True)
        ]
        return {t.group.index: found for t, found in zip(tasks, ray.get(refs), strict=True)}

    def run(self, tasks: Sequence[GroupTask]) -> list[GroupOutcome]:
        import ray

        from pipeline.run.worker import run_task

        config = self._ray_config()
        remote = ray.remote(max_retries=GROUP_RETRIES, retry_exceptions=False)(run_task)
        requests = self._requests(tasks, config)
        forwarding = [ray_hub.forward(channel) for channel in {t.progress for t in tasks if t.progress}]
        out_dir = str(self.out_dir)
        refs: list[Any] = []
        try:
            paired = any(t.settings.gate.enabled and t.settings.gate.paired for t in tasks)
            if paired or (not config.resources_per_group and not any(r.get("num_gpus") for r in requests)):
                # One server at a time: on CPUs with nothing asked per group, each server has the
                # cores to itself; a paired night's builds alternate in time (ABBA) by design.
                results = []
                for task, request in zip(tasks, requests, strict=True):
                    refs = [remote.options(**request).remote(task, out_dir)]
                    results.append(self._outcome(task, refs[0]))
                return results
            refs = [remote.options(**r).remote(t, out_dir) for t, r in zip(tasks, requests, strict=True)]
            return [self._outcome(t, ref) for t, ref in zip(tasks, refs, strict=True)]
        except BaseException:
            # Ctrl-C or SIGTERM here: let each running task stop its server (its `finally`s run
            # on the KeyboardInterrupt that cancel raises in it) before the driver exits.
            for ref in refs:
                ray.cancel(ref)
            ray.wait(refs, num_returns=len(refs), timeout=CANCEL_GRACE_S)
            raise
        finally:
            for stop in forwarding:
                stop()

    @staticmethod
    def _outcome(task: GroupTask, ref: Any) -> GroupOutcome:
        """The group's outcome; where its task itself failed (the worker crashed past its
        retries), its points are reported failed and the other groups stand."""
        import ray
        from ray.exceptions import RayError

        from pipeline.run.outcomes import GroupOutcome

        try:
            return ray.get(ref)
        except RayError as exc:
            return GroupOutcome.failed(task, f"the group's Ray task failed: {type(exc).__name__}: {exc}")
