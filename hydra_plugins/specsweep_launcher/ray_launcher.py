"""A Hydra launcher that runs each job (one server group) as a Ray task.

Why not hydra-ray-launcher: it pins cloudpickle<3, pulls in boto3, shrinks the object
store and waits forever on a resource request the cluster can never meet.
Here the request is checked against the cluster first, a dead address fails within a
deadline, and on a machine without GPUs the groups run one at a time, so two servers never
share the cores being measured.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, configure_log, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from pipeline.compose import GROUP_FILE_KEY
from pipeline.config import RayConfig
from pipeline.run.plumbing import cluster
from pipeline.run.progress import ray_hub

if TYPE_CHECKING:  # the driver's records import MLflow: not on every command line
    from pipeline.run.outcomes import GroupTask

# After Ctrl-C, how long a cancelled task gets to stop its server before we give up on it.
CANCEL_GRACE_S = 60.0
# A group whose worker or node died is run again (Ray's system-failure retries; an error in the
# group itself is not retried). The new attempt keeps what the lost one finished (pipeline.run.group).
GROUP_RETRIES = 3


def _job_in_worker(
    hydra_context: HydraContext, config: DictConfig, task_function: TaskFunction, state: dict[Any, Any], task: bytes
) -> JobReturn:
    """Runs on whichever node Ray picked. The group travels with the task (the driver's file
    may not exist on this node) and is written to a local file for the job to read."""
    import tempfile

    setup_globals()
    Singleton.set_state(state)
    with tempfile.NamedTemporaryFile("wb", suffix=".pkl", delete=False) as fh:
        fh.write(task)
    with open_dict(config):
        config[GROUP_FILE_KEY] = fh.name
    try:
        return run_job(
            hydra_context=hydra_context,
            task_function=task_function,
            config=config,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )
    finally:
        os.unlink(fh.name)


class SpecsweepRayLauncher(Launcher):
    def __init__(self) -> None:
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def _ray_config(self) -> RayConfig:
        assert self.config is not None
        values = OmegaConf.to_container(self.config.get("ray") or {}, resolve=True)
        assert isinstance(values, dict)
        return RayConfig(**values)

    def preflight(self, tasks: Sequence[GroupTask]) -> None:
        """Called by our sweeper before any server starts; raises LaunchError."""
        import ray

        config = self._ray_config()
        cluster.connect(config)
        if config.resources_per_group:
            cluster.check_resources(config.resources_per_group, cluster.node_resources())
        else:
            cluster.check_feasible(
                [cluster.Need(t.group.label, t.gpus) for t in tasks], ray.cluster_resources(), cluster.node_gpus()
            )
        if tasks:
            cluster.check_store(tasks[0].store.tracking_uri, len(cluster.node_gpus()), cluster.node_hosts())
        paired = [t.group.label for t in tasks if t.settings.gate.enabled and t.settings.gate.paired]
        cluster.check_one_machine(paired, len(cluster.node_gpus()))

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import ray

        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        ray_config = self._ray_config()
        cluster.connect(ray_config)  # a no-op after preflight
        # Ray workers run in a temporary folder: every path they get must be absolute.
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).resolve()
        configs, tasks = [], []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(cfg):
                cfg.hydra.job.id = cfg.hydra.job.num = idx
                cfg.hydra.sweep.dir = str(sweep_dir)
            configs.append(cfg)
            group_file = cfg.get(GROUP_FILE_KEY)
            tasks.append(Path(group_file).read_bytes() if group_file else b"")
        remote = ray.remote(max_retries=GROUP_RETRIES, retry_exceptions=False)(_job_in_worker)
        state = Singleton.get_state()
        from pipeline.run.outcomes import GroupTask

        requests = [cluster.group_request(ray_config, GroupTask.load_bytes(t).gpus if t else 0) for t in tasks]
        channels = {c for t in tasks if t and (c := GroupTask.load_bytes(t).progress)}
        forwarding = [ray_hub.forward(channel) for channel in channels]
        refs = []
        try:
            if not ray_config.resources_per_group and not any(r.get("num_gpus") for r in requests):
                # CPU only, nothing asked per group: one server at a time, each with the cores to itself.
                results = []
                for cfg, task, request in zip(configs, tasks, requests, strict=True):
                    refs = [remote.options(**request).remote(self.hydra_context, cfg, self.task_function, state, task)]
                    results.append(ray.get(refs[0]))
                return results
            refs = [
                remote.options(**request).remote(self.hydra_context, cfg, self.task_function, state, task)
                for cfg, task, request in zip(configs, tasks, requests, strict=True)
            ]
            return ray.get(refs)
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
