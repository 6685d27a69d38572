"""Owners, devices and subjects of the JetStreamHook tests (test_hook.py, test_hook_connection.py).
"""

from __future__ import annotations

OWNER_A = "e1407479-3136-56c0-9908-bb02fb0339e2"
OWNER_B = "7c2b8a6e-4f0e-4b69-9a59-0c8a3f1d2e11"
DEV_1 = "00000000-0000-0000-0000-000000000001"
DEV_2 = "00000000-0000-0000-0000-000000000002"
HREF_LIGHT = "78baefb2-dcdc-50c3-bb55-5ff4c5e4c8b2"


def metadata_subject(owner: str, device: str, event_type: str = "devicemetadataupdated") -> str:
    return f"plgd.owners.{owner}.devices.{device}.metadata.{event_type}"
