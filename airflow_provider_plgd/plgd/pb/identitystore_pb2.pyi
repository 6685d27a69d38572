from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AuditContext(_message.Message):
    __slots__ = ("user_id",)
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    def __init__(self, user_id: _Optional[str] = ...) -> None: ...

class EventMetadata(_message.Message):
    __slots__ = ("hub_id",)
    HUB_ID_FIELD_NUMBER: _ClassVar[int]
    hub_id: str
    def __init__(self, hub_id: _Optional[str] = ...) -> None: ...

class DevicesRegistered(_message.Message):
    __slots__ = ("owner", "device_ids", "timestamp", "audit_context", "event_metadata", "open_telemetry_carrier")
    class OpenTelemetryCarrierEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    OWNER_FIELD_NUMBER: _ClassVar[int]
    DEVICE_IDS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    AUDIT_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    EVENT_METADATA_FIELD_NUMBER: _ClassVar[int]
    OPEN_TELEMETRY_CARRIER_FIELD_NUMBER: _ClassVar[int]
    owner: str
    device_ids: _containers.RepeatedScalarFieldContainer[str]
    timestamp: int
    audit_context: AuditContext
    event_metadata: EventMetadata
    open_telemetry_carrier: _containers.ScalarMap[str, str]
    def __init__(self, owner: _Optional[str] = ..., device_ids: _Optional[_Iterable[str]] = ..., timestamp: _Optional[int] = ..., audit_context: _Optional[_Union[AuditContext, _Mapping]] = ..., event_metadata: _Optional[_Union[EventMetadata, _Mapping]] = ..., open_telemetry_carrier: _Optional[_Mapping[str, str]] = ...) -> None: ...

class DevicesUnregistered(_message.Message):
    __slots__ = ("owner", "device_ids", "timestamp", "audit_context", "event_metadata", "open_telemetry_carrier")
    class OpenTelemetryCarrierEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    OWNER_FIELD_NUMBER: _ClassVar[int]
    DEVICE_IDS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    AUDIT_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    EVENT_METADATA_FIELD_NUMBER: _ClassVar[int]
    OPEN_TELEMETRY_CARRIER_FIELD_NUMBER: _ClassVar[int]
    owner: str
    device_ids: _containers.RepeatedScalarFieldContainer[str]
    timestamp: int
    audit_context: AuditContext
    event_metadata: EventMetadata
    open_telemetry_carrier: _containers.ScalarMap[str, str]
    def __init__(self, owner: _Optional[str] = ..., device_ids: _Optional[_Iterable[str]] = ..., timestamp: _Optional[int] = ..., audit_context: _Optional[_Union[AuditContext, _Mapping]] = ..., event_metadata: _Optional[_Union[EventMetadata, _Mapping]] = ..., open_telemetry_carrier: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("devices_registered", "devices_unregistered")
    DEVICES_REGISTERED_FIELD_NUMBER: _ClassVar[int]
    DEVICES_UNREGISTERED_FIELD_NUMBER: _ClassVar[int]
    devices_registered: DevicesRegistered
    devices_unregistered: DevicesUnregistered
    def __init__(self, devices_registered: _Optional[_Union[DevicesRegistered, _Mapping]] = ..., devices_unregistered: _Optional[_Union[DevicesUnregistered, _Mapping]] = ...) -> None: ...
