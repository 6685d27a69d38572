"""The plgd page's FastAPI app, mounted by the plugin (:mod:`.plugin`) at ``/plgd`` of the api-server.

Routes (JSON unless said; every ``/api`` route needs a signed-in user, as ``/api/v2`` does: the
UI's JWT cookie or an ``Authorization: Bearer`` token):

* ``GET /plgd/`` and ``/plgd/static/*``: the page (plain HTML and JS, no build step);
* ``GET /plgd/api/pipelines``: the ETL DAGs the user may read, each with its summary
  (``?lag=true`` adds the lag behind the stream; default false: no server is contacted;
  ``?summary=false``: no summary, no table read);
* ``GET /plgd/api/pipelines/{dag_id}``: one pipeline: the status view (chain, problems, tables
  with version, files and rows, lag), counts per state and an overview of the whole chain in at
  most ``buckets`` stretches (``?lag=true`` default, ``?buckets=120``);
* ``GET /plgd/api/pipelines/{dag_id}/intervals``: one page of the intervals, newest first
  (``?offset=0&limit=200&state=hole&state=failed&order=desc|asc``), each with its state, messages,
  why, and its DAG run (``run_id``, ``run_url``) when there is one.

Auth: Airflow's auth manager decides, as for its own REST API: the list holds only the DAGs of
``get_authorized_dag_ids(user, "GET")``; a pipeline's routes need ``is_authorized_dag(GET)`` for
that DAG (``requires_access_dag``), else 403 and no data. Unknown or non-ETL DAGs: 404.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlsplit

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from airflow.configuration import conf
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from airflow_provider_plgd.ui import pipelines, timeline

STATIC = Path(__file__).resolve().parent / "static"
_cache = pipelines.StatusCache()


def ui_root() -> str:
    """The path of Airflow's UI (``[api] base_url``'s path), ending in ``/``."""
    path = urlsplit(conf.get("api", "base_url", fallback="") or "").path or "/"
    return path if path.endswith("/") else path + "/"


def _pipeline(dag_id: str, session: Any) -> pipelines.EtlPipeline:
    found = pipelines.find_pipelines([dag_id], session)
    if not found:
        raise HTTPException(404, f"{dag_id!r} is not a plgd ETL DAG (build_etl_dag) of this Airflow")
    return found[0]


def _status(pipeline: pipelines.EtlPipeline, lag: bool) -> tuple[Any, list[timeline.IntervalRow], str | None]:
    try:
        return _cache.get(pipeline, lag=lag)
    except ValueError as err:  # a refused root, a missing connection: say so, as plgd-etl status would
        raise HTTPException(422, f"{pipeline.dag_id}: {err}") from None


def _summary(pipeline: pipelines.EtlPipeline, lag: bool, buckets: int) -> dict[str, Any]:
    view, rows, lag_error = _status(pipeline, lag)
    try:
        summary = timeline.pipeline_summary(view, rows, buckets=buckets)
    except ValueError as err:
        raise HTTPException(422, str(err)) from None
    return {**pipeline.as_dict(), "dag_url": f"{ui_root()}dags/{quote(pipeline.dag_id)}", **summary,
            "lag_error": lag_error}


def create_app() -> FastAPI:
    """The app the plugin mounts (module docstring)."""
    app = FastAPI(title="plgd pipelines", description=__doc__)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/api/pipelines")
    def list_pipelines(user: GetUserDep, session: SessionDep, lag: Annotated[bool, Query()] = False,
                       summary: Annotated[bool, Query()] = True) -> dict[str, Any]:
        """The ETL DAGs the user may read, each with its summary (without the overview); with
        ``summary=false`` only what their DAGs fix (no table is read: the page's first request)."""
        readable = get_auth_manager().get_authorized_dag_ids(user=user, method="GET")
        ids = [d for d in pipelines.active_dag_ids(session) if d in readable]
        out = []
        for pipeline in pipelines.find_pipelines(ids, session):
            if not summary:
                out.append(pipeline.as_dict())
                continue
            try:
                entry = _summary(pipeline, lag, 1)
            except HTTPException as err:
                entry = {**pipeline.as_dict(), "error": err.detail}
            entry.pop("overview", None)
            out.append(entry)
        return {"pipelines": out}

    @app.get("/api/pipelines/{dag_id}", dependencies=[Depends(requires_access_dag("GET"))])
    def get_pipeline(dag_id: str, session: SessionDep, lag: Annotated[bool, Query()] = True,
                     buckets: Annotated[int, Query(ge=1, le=timeline.MAX_BUCKETS)] = 120) -> dict[str, Any]:
        """One pipeline's summary (module docstring)."""
        return _summary(_pipeline(dag_id, session), lag, buckets)

    @app.get("/api/pipelines/{dag_id}/intervals", dependencies=[Depends(requires_access_dag("GET"))])
    def get_intervals(request: Request, dag_id: str, session: SessionDep,
                      offset: Annotated[int, Query(ge=0)] = 0,
                      limit: Annotated[int, Query(ge=1, le=timeline.MAX_PAGE)] = 200,
                      state: Annotated[list[str] | None, Query()] = None,
                      order: Annotated[str, Query(pattern="^(asc|desc)$")] = "desc") -> dict[str, Any]:
        """One page of the intervals with their states and DAG runs (module docstring)."""
        pipeline = _pipeline(dag_id, session)
        _view, rows, _ = _status(pipeline, False)
        try:
            result = timeline.page(rows, offset=offset, limit=limit, states=state, newest_first=order == "desc")
        except ValueError as err:
            raise HTTPException(422, str(err)) from None
        runs = pipelines.run_ids_by_interval(dag_id, result["items"], session)
        base = f"{ui_root()}dags/{quote(dag_id)}/runs/"
        for item in result["items"]:
            run_id = runs.get(item["interval_id"])
            item["run_id"] = run_id
            item["run_url"] = base + quote(run_id, safe="") if run_id else None
        return {"dag_id": dag_id, **result}

    return app
