"""The subject and the trigger runner of the sensor and trigger tests (test_sensor_triggers.py,
test_sensor_server_clock.py).
"""

from __future__ import annotations

import asyncio

from airflow_provider_plgd.plgd.subjects import registrations_subject

O1 = "e1407479-3136-56c0-9908-bb02fb0339e2"
SUBJ = registrations_subject(O1, "devicesregistered")


async def first_event(trigger, timeout: float):
    agen = trigger.run()
    try:
        return (await asyncio.wait_for(agen.__anext__(), timeout)).payload
    finally:
        await agen.aclose()
