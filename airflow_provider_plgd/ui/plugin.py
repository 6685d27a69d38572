"""The ``AirflowPlugin`` of the provider: the plgd page in the Airflow 3 UI (docs/ui.md).

Registered twice over, so that it loads however Airflow looks for plugins: the provider's
``plugins`` entry (``get_provider_info``) and the ``airflow.plugins`` entry point (``setup.cfg``);
Airflow loads a plugin name once. On Airflow 3 it adds a FastAPI app at ``/plgd`` of the
api-server (:mod:`.api`) and an external view in the navigation (Browse > plgd pipelines) that
shows its page; on Airflow 2 it adds nothing (the page needs the Airflow 3 UI; ``plgd-etl
status`` and the metrics stay).

The app is built on its first request (:class:`LazyAsgiApp`): every Airflow process loads the
plugins (scheduler, workers, ``dags test``), and only the api-server serves it.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any
from urllib.parse import urlsplit

from airflow.configuration import conf
from airflow.plugins_manager import AirflowPlugin

from airflow_provider_plgd.compat import AIRFLOW_V_3

#: Where the app is mounted on the api-server.
URL_PREFIX = "/plgd"
#: The route of the external view in the UI (``/plugin/<route>``).
URL_ROUTE = "plgd"


class LazyAsgiApp:
    """An ASGI app that imports ``factory`` (``"module:function"``) and builds the real app on the first call."""

    def __init__(self, factory: str) -> None:
        self.factory = factory
        self._app: Any = None
        self._lock = threading.Lock()

    def _get(self) -> Any:
        with self._lock:
            if self._app is None:
                module, name = self.factory.split(":")
                self._app = getattr(importlib.import_module(module), name)()
            return self._app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self._get()(scope, receive, send)

    def __repr__(self) -> str:  # the plugins REST API shows the app as a string
        return f"{type(self).__name__}({self.factory!r})"


def page_href() -> str:
    """The page's path: ``[api] base_url``'s path, then ``plgd/``."""
    path = urlsplit(conf.get("api", "base_url", fallback="") or "").path or "/"
    return (path if path.endswith("/") else path + "/") + URL_PREFIX.strip("/") + "/"


class PlgdPlugin(AirflowPlugin):
    """The plgd page (module docstring)."""

    name = "plgd"
    fastapi_apps = ([{"name": "plgd", "app": LazyAsgiApp("airflow_provider_plgd.ui.api:create_app"),
                      "url_prefix": URL_PREFIX}] if AIRFLOW_V_3 else [])
    external_views = ([{"name": "plgd pipelines", "href": page_href(), "destination": "nav",
                        "url_route": URL_ROUTE, "category": "browse"}] if AIRFLOW_V_3 else [])
