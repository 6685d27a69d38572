from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class Event(_message.Message):
    __slots__ = ("version", "event_type", "group_id", "aggregate_id", "data", "is_snapshot", "timestamp")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EVENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    AGGREGATE_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    IS_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    version: int
    event_type: str
    group_id: str
    aggregate_id: str
    data: bytes
    is_snapshot: bool
    timestamp: int
    def __init__(self, version: _Optional[int] = ..., event_type: _Optional[str] = ..., group_id: _Optional[str] = ..., aggregate_id: _Optional[str] = ..., data: _Optional[bytes] = ..., is_snapshot: _Optional[bool] = ..., timestamp: _Optional[int] = ...) -> None: ...
