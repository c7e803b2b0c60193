"""kedro-mlflow's hook, imported when a run starts rather than when a session is made.

kedro-mlflow registers its hook through an entry point whose module imports MLflow (1.8 s here), and its
``after_context_created`` opens the tracking store: every ``kedro`` command that makes a session
(``kedro catalog describe-datasets``, ``kedro viz``) paid both, even one that runs nothing, and with tracking off
Kedro imported the module before unregistering it. ``DeferredMlflowHook`` takes the entry point's name, so pluggy
never loads it (``load_setuptools_entrypoints`` skips a name already registered), and hands kedro-mlflow's own
hook what it would have seen when a pipeline starts: the session's context and catalog, then each later call.
``context.mlflow`` (kedro-mlflow's configuration, read by ``kedro mlflow ui`` and in notebooks) sets it up when
first read.
"""

from __future__ import annotations

from typing import Any

from kedro.framework.hooks import hook_impl

# kedro-mlflow's entry point in the ``kedro.hooks`` group (its wheel's entry_points.txt).
ENTRY_POINT = "mlflow_hook"


class DeferredMlflowHook:
    """kedro-mlflow's ``MlflowHook``, made and set up at ``before_pipeline_run`` (``enabled``), or never (tracking
    off: then this only keeps kedro-mlflow's module from being imported)."""

    __name__ = ENTRY_POINT  # pluggy's name for this plugin: the entry point of the same name is then not loaded

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._hook = None  # kedro-mlflow's hook, once set up (only ever where ``enabled``)
        self._context = None
        self._set_up = None  # the context kedro-mlflow's hook was set up with
        self._catalog_created: dict[str, Any] | None = None

    @hook_impl
    def after_context_created(self, context) -> None:
        self._context = context
        if self.enabled:
            context.__setattr__("mlflow", _SetUpWhenRead(self))  # as kedro-mlflow sets it (KedroContext is frozen)

    def set_up(self):
        """kedro-mlflow's hook, set up with the latest context (once per context): its configuration."""
        if self._hook is None:
            from kedro_mlflow.framework.hooks.mlflow_hook import mlflow_hook

            self._hook = mlflow_hook  # the entry point's own instance, as Kedro would have registered it
        if self._set_up is not self._context:
            self._hook.after_context_created(context=self._context)
            self._set_up = self._context
        return self._hook.mlflow_config

    @hook_impl
    def after_catalog_created(self, catalog, conf_catalog, conf_creds, parameters, save_version, load_versions) -> None:
        self._catalog_created = {
            "catalog": catalog, "conf_catalog": conf_catalog, "conf_creds": conf_creds, "parameters": parameters,
            "save_version": save_version, "load_versions": load_versions,
        }  # fmt: skip

    @hook_impl
    def before_pipeline_run(self, run_params: dict[str, Any], pipeline, catalog) -> None:
        if not self.enabled:
            return
        self.set_up()
        if self._catalog_created is not None:
            self._hook.after_catalog_created(**self._catalog_created)
        self._hook.before_pipeline_run(run_params=run_params, pipeline=pipeline, catalog=catalog)

    @hook_impl
    def before_node_run(self, node, catalog, inputs: dict[str, Any], is_async: bool) -> None:
        if self._hook is not None:  # set up: tracking is on and a run started
            self._hook.before_node_run(node=node, catalog=catalog, inputs=inputs, is_async=is_async)

    @hook_impl
    def after_pipeline_run(self, run_params: dict[str, Any], pipeline, catalog) -> None:
        if self._hook is not None:  # set up: tracking is on and a run started
            self._hook.after_pipeline_run(run_params=run_params, pipeline=pipeline, catalog=catalog)

    @hook_impl
    def on_pipeline_error(self, error: Exception, run_params: dict[str, Any], pipeline, catalog) -> None:
        if self._hook is not None:  # set up: tracking is on and a run started
            self._hook.on_pipeline_error(error=error, run_params=run_params, pipeline=pipeline, catalog=catalog)


class _SetUpWhenRead:
    """``context.mlflow`` until it is read: then kedro-mlflow's hook is set up (which puts its configuration in
    ``context.mlflow``) and the name is read from that configuration."""

    def __init__(self, hook: DeferredMlflowHook) -> None:
        self._deferred = hook

    def __getattr__(self, name: str):
        return getattr(self._deferred.set_up(), name)
