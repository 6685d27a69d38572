from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UNKNOWN: _ClassVar[Status]
    OK: _ClassVar[Status]
    BAD_REQUEST: _ClassVar[Status]
    UNAUTHORIZED: _ClassVar[Status]
    FORBIDDEN: _ClassVar[Status]
    NOT_FOUND: _ClassVar[Status]
    UNAVAILABLE: _ClassVar[Status]
    NOT_IMPLEMENTED: _ClassVar[Status]
    ACCEPTED: _ClassVar[Status]
    ERROR: _ClassVar[Status]
    METHOD_NOT_ALLOWED: _ClassVar[Status]
    CREATED: _ClassVar[Status]
    CANCELED: _ClassVar[Status]
    NOT_MODIFIED: _ClassVar[Status]
UNKNOWN: Status
OK: Status
BAD_REQUEST: Status
UNAUTHORIZED: Status
FORBIDDEN: Status
NOT_FOUND: Status
UNAVAILABLE: Status
NOT_IMPLEMENTED: Status
ACCEPTED: Status
ERROR: Status
METHOD_NOT_ALLOWED: Status
CREATED: Status
CANCELED: Status
NOT_MODIFIED: Status

class AuditContext(_message.Message):
    __slots__ = ("user_id", "correlation_id", "owner")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    correlation_id: str
    owner: str
    def __init__(self, user_id: _Optional[str] = ..., correlation_id: _Optional[str] = ..., owner: _Optional[str] = ...) -> None: ...

class ResourceId(_message.Message):
    __slots__ = ("device_id", "href")
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    HREF_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    href: str
    def __init__(self, device_id: _Optional[str] = ..., href: _Optional[str] = ...) -> None: ...

class Policy(_message.Message):
    __slots__ = ("bit_flags",)
    BIT_FLAGS_FIELD_NUMBER: _ClassVar[int]
    bit_flags: int
    def __init__(self, bit_flags: _Optional[int] = ...) -> None: ...

class EndpointInformation(_message.Message):
    __slots__ = ("endpoint", "priority")
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    endpoint: str
    priority: int
    def __init__(self, endpoint: _Optional[str] = ..., priority: _Optional[int] = ...) -> None: ...

class Resource(_message.Message):
    __slots__ = ("href", "device_id", "resource_types", "interfaces", "anchor", "title", "supported_content_types", "valid_until", "policy", "endpoint_informations")
    HREF_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPES_FIELD_NUMBER: _ClassVar[int]
    INTERFACES_FIELD_NUMBER: _ClassVar[int]
    ANCHOR_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_CONTENT_TYPES_FIELD_NUMBER: _ClassVar[int]
    VALID_UNTIL_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_INFORMATIONS_FIELD_NUMBER: _ClassVar[int]
    href: str
    device_id: str
    resource_types: _containers.RepeatedScalarFieldContainer[str]
    interfaces: _containers.RepeatedScalarFieldContainer[str]
    anchor: str
    title: str
    supported_content_types: _containers.RepeatedScalarFieldContainer[str]
    valid_until: int
    policy: Policy
    endpoint_informations: _containers.RepeatedCompositeFieldContainer[EndpointInformation]
    def __init__(self, href: _Optional[str] = ..., device_id: _Optional[str] = ..., resource_types: _Optional[_Iterable[str]] = ..., interfaces: _Optional[_Iterable[str]] = ..., anchor: _Optional[str] = ..., title: _Optional[str] = ..., supported_content_types: _Optional[_Iterable[str]] = ..., valid_until: _Optional[int] = ..., policy: _Optional[_Union[Policy, _Mapping]] = ..., endpoint_informations: _Optional[_Iterable[_Union[EndpointInformation, _Mapping]]] = ...) -> None: ...

class Content(_message.Message):
    __slots__ = ("data", "content_type", "coap_content_format")
    DATA_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    COAP_CONTENT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    content_type: str
    coap_content_format: int
    def __init__(self, data: _Optional[bytes] = ..., content_type: _Optional[str] = ..., coap_content_format: _Optional[int] = ...) -> None: ...

class CommandMetadata(_message.Message):
    __slots__ = ("connection_id", "sequence")
    CONNECTION_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    connection_id: str
    sequence: int
    def __init__(self, connection_id: _Optional[str] = ..., sequence: _Optional[int] = ...) -> None: ...

class Connection(_message.Message):
    __slots__ = ("status", "id", "connected_at", "protocol", "service_id", "local_endpoints")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OFFLINE: _ClassVar[Connection.Status]
        ONLINE: _ClassVar[Connection.Status]
    OFFLINE: Connection.Status
    ONLINE: Connection.Status
    class Protocol(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNKNOWN: _ClassVar[Connection.Protocol]
        COAP: _ClassVar[Connection.Protocol]
        COAPS: _ClassVar[Connection.Protocol]
        COAP_TCP: _ClassVar[Connection.Protocol]
        COAPS_TCP: _ClassVar[Connection.Protocol]
        C2C: _ClassVar[Connection.Protocol]
    UNKNOWN: Connection.Protocol
    COAP: Connection.Protocol
    COAPS: Connection.Protocol
    COAP_TCP: Connection.Protocol
    COAPS_TCP: Connection.Protocol
    C2C: Connection.Protocol
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_AT_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    SERVICE_ID_FIELD_NUMBER: _ClassVar[int]
    LOCAL_ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    status: Connection.Status
    id: str
    connected_at: int
    protocol: Connection.Protocol
    service_id: str
    local_endpoints: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, status: _Optional[_Union[Connection.Status, str]] = ..., id: _Optional[str] = ..., connected_at: _Optional[int] = ..., protocol: _Optional[_Union[Connection.Protocol, str]] = ..., service_id: _Optional[str] = ..., local_endpoints: _Optional[_Iterable[str]] = ...) -> None: ...

class TwinSynchronization(_message.Message):
    __slots__ = ("state", "syncing_at", "in_sync_at", "command_metadata", "force_synchronization_at")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OUT_OF_SYNC: _ClassVar[TwinSynchronization.State]
        DISABLED: _ClassVar[TwinSynchronization.State]
        SYNCING: _ClassVar[TwinSynchronization.State]
        IN_SYNC: _ClassVar[TwinSynchronization.State]
    OUT_OF_SYNC: TwinSynchronization.State
    DISABLED: TwinSynchronization.State
    SYNCING: TwinSynchronization.State
    IN_SYNC: TwinSynchronization.State
    STATE_FIELD_NUMBER: _ClassVar[int]
    SYNCING_AT_FIELD_NUMBER: _ClassVar[int]
    IN_SYNC_AT_FIELD_NUMBER: _ClassVar[int]
    COMMAND_METADATA_FIELD_NUMBER: _ClassVar[int]
    FORCE_SYNCHRONIZATION_AT_FIELD_NUMBER: _ClassVar[int]
    state: TwinSynchronization.State
    syncing_at: int
    in_sync_at: int
    command_metadata: CommandMetadata
    force_synchronization_at: int
    def __init__(self, state: _Optional[_Union[TwinSynchronization.State, str]] = ..., syncing_at: _Optional[int] = ..., in_sync_at: _Optional[int] = ..., command_metadata: _Optional[_Union[CommandMetadata, _Mapping]] = ..., force_synchronization_at: _Optional[int] = ...) -> None: ...

class EventMetadata(_message.Message):
    __slots__ = ("version", "timestamp", "connection_id", "sequence", "hub_id")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    CONNECTION_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    HUB_ID_FIELD_NUMBER: _ClassVar[int]
    version: int
    timestamp: int
    connection_id: str
    sequence: int
    hub_id: str
    def __init__(self, version: _Optional[int] = ..., timestamp: _Optional[int] = ..., connection_id: _Optional[str] = ..., sequence: _Optional[int] = ..., hub_id: _Optional[str] = ...) -> None: ...

class ResourceLinksPublished(_message.Message):
    __slots__ = ("device_id", "resources", "audit_context", "event_metadata", "open_telemetry_carrier")
    class OpenTelemetryCarrierEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    AUDIT_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    EVENT_METADATA_FIELD_NUMBER: _ClassVar[int]
    OPEN_TELEMETRY_CARRIER_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    resources: _containers.RepeatedCompositeFieldContainer[Resource]
    audit_context: AuditContext
    event_metadata: EventMetadata
    open_telemetry_carrier: _containers.ScalarMap[str, str]
    def __init__(self, device_id: _Optional[str] = ..., resources: _Optional[_Iterable[_Union[Resource, _Mapping]]] = ..., audit_context: _Optional[_Union[AuditContext, _Mapping]] = ..., event_metadata: _Optional[_Union[EventMetadata, _Mapping]] = ..., open_telemetry_carrier: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ResourceLinksUnpublished(_message.Message):
    __slots__ = ("device_id", "hrefs", "audit_context", "event_metadata", "open_telemetry_carrier")
    class OpenTelemetryCarrierEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    HREFS_FIELD_NUMBER: _ClassVar[int]
    AUDIT_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    EVENT_METADATA_FIELD_NUMBER: _ClassVar[int]
    OPEN_TELEMETRY_CARRIER_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    hrefs: _containers.RepeatedScalarFieldContainer[str]
    audit_context: AuditContext
    event_metadata: EventMetadata
    open_telemetry_carrier: _containers.ScalarMap[str, str]
    def __init__(self, device_id: _Optional[str] = ..., hrefs: _Optional[_Iterable[str]] = ..., audit_context: _Optional[_Union[AuditContext, _Mapping]] = ..., event_metadata: _Optional[_Union[EventMetadata, _Mapping]] = ..., open_telemetry_carrier: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ResourceLinksSnapshotTaken(_message.Message):
    __slots__ = ("device_id", "resources", "event_metadata", "audit_context")
    class ResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Resource
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Resource, _Mapping]] = ...) -> None: ...
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    EVENT_METADATA_FIELD_NUMBER: _ClassVar[int]
    AUDIT_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    resources: _containers.MessageMap[str, Resource]
    event_metadata: EventMetadata
    audit_context: AuditContext
    def __init__(self, device_id: _Optional[str] = ..., resources: _Optional[_Mapping[str, Resource]] = ..., event_metadata: _Optional[_Union[EventMetadata, _Mapping]] = ..., audit_context: _Optional[_Union[AuditContext, _Mapping]] = ...) -> None: ...

class ResourceChanged(_message.Message):
    __slots__ = ("resource_id", "content", "status", "audit_context", "event_metadata", "etag", "resource_types", "open_telemetry_carrier")
    class OpenTelemetryCarrierEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    AUDIT_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    EVENT_METADATA_FIELD_NUMBER: _ClassVar[int]
    ETAG_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPES_FIELD_NUMBER: _ClassVar[int]
    OPEN_TELEMETRY_CARRIER_FIELD_NUMBER: _ClassVar[int]
    resource_id: ResourceId
    content: Content
    status: Status
    audit_context: AuditContext
    event_metadata: EventMetadata
    etag: bytes
    resource_types: _containers.RepeatedScalarFieldContainer[str]
    open_telemetry_carrier: _containers.ScalarMap[str, str]
    def __init__(self, resource_id: _Optional[_Union[ResourceId, _Mapping]] = ..., content: _Optional[_Union[Content, _Mapping]] = ..., status: _Optional[_Union[Status, str]] = ..., audit_context: _Optional[_Union[AuditContext, _Mapping]] = ..., event_metadata: _Optional[_Union[EventMetadata, _Mapping]] = ..., etag: _Optional[bytes] = ..., resource_types: _Optional[_Iterable[str]] = ..., open_telemetry_carrier: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ResourceUpdatePending(_message.Message):
    __slots__ = ("resource_id", "resource_interface", "content", "audit_context", "event_metadata", "valid_until", "resource_types", "open_telemetry_carrier")
    class OpenTelemetryCarrierEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_INTERFACE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    AUDIT_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    EVENT_METADATA_FIELD_NUMBER: _ClassVar[int]
    VALID_UNTIL_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPES_FIELD_NUMBER: _ClassVar[int]
    OPEN_TELEMETRY_CARRIER_FIELD_NUMBER: _ClassVar[int]
    resource_id: ResourceId
    resource_interface: str
    content: Content
    audit_context: AuditContext
    event_metadata: EventMetadata
    valid_until: int
    resource_types: _containers.RepeatedScalarFieldContainer[str]
    open_telemetry_carrier: _containers.ScalarMap[str, str]
    def __init__(self, resource_id: _Optional[_Union[ResourceId, _Mapping]] = ..., resource_interface: _Optional[str] = ..., content: _Optional[_Union[Content, _Mapping]] = ..., audit_context: _Optional[_Union[AuditContext, _Mapping]] = ..., event_metadata: _Optional[_Union[EventMetadata, _Mapping]] = ..., valid_until: _Optional[int] = ..., resource_types: _Optional[_Iterable[str]] = ..., open_telemetry_carrier: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ResourceUpdated(_message.Message):
    __slots__ = ("resource_id", "status", "content", "audit_context", "event_metadata", "resource_types", "open_telemetry_carrier")
    class OpenTelemetryCarrierEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    AUDIT_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    EVENT_METADATA_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPES_FIELD_NUMBER: _ClassVar[int]
    OPEN_TELEMETRY_CARRIER_FIELD_NUMBER: _ClassVar[int]
    resource_id: ResourceId
    status: Status
    content: Content
    audit_context: AuditContext
    event_metadata: EventMetadata
    resource_types: _containers.RepeatedScalarFieldContainer[str]
    open_telemetry_carrier: _containers.ScalarMap[str, str]
    def __init__(self, resource_id: _Optional[_Union[ResourceId, _Mapping]] = ..., status: _Optional[_Union[Status, str]] = ..., content: _Optional[_Union[Content, _Mapping]] = ..., audit_context: _Optional[_Union[AuditContext, _Mapping]] = ..., event_metadata: _Optional[_Union[EventMetadata, _Mapping]] = ..., resource_types: _Optional[_Iterable[str]] = ..., open_telemetry_carrier: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ResourceRetrievePending(_message.Message):
    __slots__ = ("resource_id", "resource_interface", "audit_context", "event_metadata", "valid_until", "etag", "resource_types", "open_telemetry_carrier")
    class OpenTelemetryCarrierEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_INTERFACE_FIELD_NUMBER: _ClassVar[int]
    AUDIT_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    EVENT_METADATA_FIELD_NUMBER: _ClassVar[int]
    VALID_UNTIL_FIELD_NUMBER: _ClassVar[int]
    ETAG_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPES_FIELD_NUMBER: _ClassVar[int]
    OPEN_TELEMETRY_CARRIER_FIELD_NUMBER: _ClassVar[int]
    resource_id: ResourceId
    resource_interface: str
    audit_context: AuditContext
    event_metadata: EventMetadata
    valid_until: int
    etag: _containers.RepeatedScalarFieldContainer[bytes]
    resource_types: _containers.RepeatedScalarFieldContainer[str]
    open_telemetry_carrier: _containers.ScalarMap[str, str]
    def __init__(self, resource_id: _Optional[_Union[ResourceId, _Mapping]] = ..., resource_interface: _Optional[str] = ..., audit_context: _Optional[_Union[AuditContext, _Mapping]] = ..., event_metadata: _Optional[_Union[EventMetadata, _Mapping]] = ..., valid_until: _Optional[int] = ..., etag: _Optional[_Iterable[bytes]] = ..., resource_types: _Optional[_Iterable[str]] = ..., open_telemetry_carrier: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ResourceRetrieved(_message.Message):
    __slots__ = ("resource_id", "status", "content", "audit_context", "event_metadata", "etag", "resource_types", "open_telemetry_carrier")
    class OpenTelemetryCarrierEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    AUDIT_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    EVENT_METADATA_FIELD_NUMBER: _ClassVar[int]
    ETAG_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPES_FIELD_NUMBER: _ClassVar[int]
    OPEN_TELEMETRY_CARRIER_FIELD_NUMBER: _ClassVar[int]
    resource_id: ResourceId
    status: Status
    content: Content
    audit_context: AuditContext
    event_metadata: EventMetadata
    etag: bytes
    resource_types: _containers.RepeatedScalarFieldContainer[str]
    open_telemetry_carrier: _containers.ScalarMap[str, str]
    def __init__(self, resource_id: _Optional[_Union[ResourceId, _Mapping]] = ..., status: _Optional[_Union[Status, str]] = ..., content: _Optional[_Union[Content, _Mapping]] = ..., audit_context: _Optional[_Union[AuditContext, _Mapping]] = ..., event_metadata: _Optional[_Union[EventMetadata, _Mapping]] = ..., etag: _Optional[bytes] = ..., resource_types: _Optional[_Iterable[str]] = ..., open_telemetry_carrier: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ResourceDeletePending(_message.Message):
    __slots__ = ("resource_id", "audit_context", "event_metadata", "valid_until", "resource_interface", "resource_types", "open_telemetry_carrier")
    class OpenTelemetryCarrierEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    AUDIT_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    EVENT_METADATA_FIELD_NUMBER: _ClassVar[int]
    VALID_UNTIL_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_INTERFACE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPES_FIELD_NUMBER: _ClassVar[int]
    OPEN_TELEMETRY_CARRIER_FIELD_NUMBER: _ClassVar[int]
    resource_id: ResourceId
    audit_context: AuditContext
    event_metadata: EventMetadata
    valid_until: int
    resource_interface: str
    resource_types: _containers.RepeatedScalarFieldContainer[str]
    open_telemetry_carrier: _containers.ScalarMap[str, str]
    def __init__(self, resource_id: _Optional[_Union[ResourceId, _Mapping]] = ..., audit_context: _Optional[_Union[AuditContext, _Mapping]] = ..., event_metadata: _Optional[_Union[EventMetadata, _Mapping]] = ..., valid_until: _Optional[int] = ..., resource_interface: _Optional[str] = ..., resource_types: _Optional[_Iterable[str]] = ..., open_telemetry_carrier: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ResourceDeleted(_message.Message):
    __slots__ = ("resource_id", "status", "content", "audit_context", "event_metadata", "resource_types", "open_telemetry_carrier")
    class OpenTelemetryCarrierEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    AUDIT_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    EVENT_METADATA_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPES_FIELD_NUMBER: _ClassVar[int]
    OPEN_TELEMETRY_CARRIER_FIELD_NUMBER: _ClassVar[int]
    resource_id: ResourceId
    status: Status
    content: Content
    audit_context: AuditContext
    event_metadata: EventMetadata
    resource_types: _containers.RepeatedScalarFieldContainer[str]
    open_telemetry_carrier: _containers.ScalarMap[str, str]
    def __init__(self, resource_id: _Optional[_Union[ResourceId, _Mapping]] = ..., status: _Optional[_Union[Status, str]] = ..., content: _Optional[_Union[Content, _Mapping]] = ..., audit_context: _Optional[_Union[AuditContext, _Mapping]] = ..., event_metadata: _Optional[_Union[EventMetadata, _Mapping]] = ..., resource_types: _Optional[_Iterable[str]] = ..., open_telemetry_carrier: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ResourceCreatePending(_message.Message):
    __slots__ = ("resource_id", "content", "audit_context", "event_metadata", "valid_until", "resource_types", "open_telemetry_carrier")
    class OpenTelemetryCarrierEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    AUDIT_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    EVENT_METADATA_FIELD_NUMBER: _ClassVar[int]
    VALID_UNTIL_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPES_FIELD_NUMBER: _ClassVar[int]
    OPEN_TELEMETRY_CARRIER_FIELD_NUMBER: _ClassVar[int]
    resource_id: ResourceId
    content: Content
    audit_context: AuditContext
    event_metadata: EventMetadata
    valid_until: int
    resource_types: _containers.RepeatedScalarFieldContainer[str]
    open_telemetry_carrier: _containers.ScalarMap[str, str]
    def __init__(self, resource_id: _Optional[_Union[ResourceId, _Mapping]] = ..., content: _Optional[_Union[Content, _Mapping]] = ..., audit_context: _Optional[_Union[AuditContext, _Mapping]] = ..., event_metadata: _Optional[_Union[EventMetadata, _Mapping]] = ..., valid_until: _Optional[int] = ..., resource_types: _Optional[_Iterable[str]] = ..., open_telemetry_carrier: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ResourceCreated(_message.Message):
    __slots__ = ("resource_id", "status", "content", "audit_context", "event_metadata", "resource_types", "open_telemetry_carrier")
    class OpenTelemetryCarrierEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    AUDIT_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    EVENT_METADATA_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPES_FIELD_NUMBER: _ClassVar[int]
    OPEN_TELEMETRY_CARRIER_FIELD_NUMBER: _ClassVar[int]
    resource_id: ResourceId
    status: Status
    content: Content
    audit_context: AuditContext
    event_metadata: EventMetadata
    resource_types: _containers.RepeatedScalarFieldContainer[str]
    open_telemetry_carrier: _containers.ScalarMap[str, str]
    def __init__(self, resource_id: _Optional[_Union[ResourceId, _Mapping]] = ..., status: _Optional[_Union[Status, str]] = ..., content: _Optional[_Union[Content, _Mapping]] = ..., audit_context: _Optional[_Union[AuditContext, _Mapping]] = ..., event_metadata: _Optional[_Union[EventMetadata, _Mapping]] = ..., resource_types: _Optional[_Iterable[str]] = ..., open_telemetry_carrier: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ResourceStateSnapshotTaken(_message.Message):
    __slots__ = ("resource_id", "latest_resource_change", "resource_create_pendings", "resource_retrieve_pendings", "resource_update_pendings", "resource_delete_pendings", "audit_context", "event_metadata", "resource_types")
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    LATEST_RESOURCE_CHANGE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_CREATE_PENDINGS_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_RETRIEVE_PENDINGS_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_UPDATE_PENDINGS_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_DELETE_PENDINGS_FIELD_NUMBER: _ClassVar[int]
    AUDIT_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    EVENT_METADATA_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPES_FIELD_NUMBER: _ClassVar[int]
    resource_id: ResourceId
    latest_resource_change: ResourceChanged
    resource_create_pendings: _containers.RepeatedCompositeFieldContainer[ResourceCreatePending]
    resource_retrieve_pendings: _containers.RepeatedCompositeFieldContainer[ResourceRetrievePending]
    resource_update_pendings: _containers.RepeatedCompositeFieldContainer[ResourceUpdatePending]
    resource_delete_pendings: _containers.RepeatedCompositeFieldContainer[ResourceDeletePending]
    audit_context: AuditContext
    event_metadata: EventMetadata
    resource_types: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, resource_id: _Optional[_Union[ResourceId, _Mapping]] = ..., latest_resource_change: _Optional[_Union[ResourceChanged, _Mapping]] = ..., resource_create_pendings: _Optional[_Iterable[_Union[ResourceCreatePending, _Mapping]]] = ..., resource_retrieve_pendings: _Optional[_Iterable[_Union[ResourceRetrievePending, _Mapping]]] = ..., resource_update_pendings: _Optional[_Iterable[_Union[ResourceUpdatePending, _Mapping]]] = ..., resource_delete_pendings: _Optional[_Iterable[_Union[ResourceDeletePending, _Mapping]]] = ..., audit_context: _Optional[_Union[AuditContext, _Mapping]] = ..., event_metadata: _Optional[_Union[EventMetadata, _Mapping]] = ..., resource_types: _Optional[_Iterable[str]] = ...) -> None: ...

class DeviceMetadataUpdated(_message.Message):
    __slots__ = ("device_id", "connection", "audit_context", "event_metadata", "canceled", "twin_synchronization", "twin_enabled", "open_telemetry_carrier")
    class OpenTelemetryCarrierEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    CONNECTION_FIELD_NUMBER: _ClassVar[int]
    AUDIT_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    EVENT_METADATA_FIELD_NUMBER: _ClassVar[int]
    CANCELED_FIELD_NUMBER: _ClassVar[int]
    TWIN_SYNCHRONIZATION_FIELD_NUMBER: _ClassVar[int]
    TWIN_ENABLED_FIELD_NUMBER: _ClassVar[int]
    OPEN_TELEMETRY_CARRIER_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    connection: Connection
    audit_context: AuditContext
    event_metadata: EventMetadata
    canceled: bool
    twin_synchronization: TwinSynchronization
    twin_enabled: bool
    open_telemetry_carrier: _containers.ScalarMap[str, str]
    def __init__(self, device_id: _Optional[str] = ..., connection: _Optional[_Union[Connection, _Mapping]] = ..., audit_context: _Optional[_Union[AuditContext, _Mapping]] = ..., event_metadata: _Optional[_Union[EventMetadata, _Mapping]] = ..., canceled: _Optional[bool] = ..., twin_synchronization: _Optional[_Union[TwinSynchronization, _Mapping]] = ..., twin_enabled: _Optional[bool] = ..., open_telemetry_carrier: _Optional[_Mapping[str, str]] = ...) -> None: ...

class DeviceMetadataUpdatePending(_message.Message):
    __slots__ = ("device_id", "twin_enabled", "twin_force_synchronization", "audit_context", "event_metadata", "valid_until", "open_telemetry_carrier")
    class OpenTelemetryCarrierEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    TWIN_ENABLED_FIELD_NUMBER: _ClassVar[int]
    TWIN_FORCE_SYNCHRONIZATION_FIELD_NUMBER: _ClassVar[int]
    AUDIT_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    EVENT_METADATA_FIELD_NUMBER: _ClassVar[int]
    VALID_UNTIL_FIELD_NUMBER: _ClassVar[int]
    OPEN_TELEMETRY_CARRIER_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    twin_enabled: bool
    twin_force_synchronization: bool
    audit_context: AuditContext
    event_metadata: EventMetadata
    valid_until: int
    open_telemetry_carrier: _containers.ScalarMap[str, str]
    def __init__(self, device_id: _Optional[str] = ..., twin_enabled: _Optional[bool] = ..., twin_force_synchronization: _Optional[bool] = ..., audit_context: _Optional[_Union[AuditContext, _Mapping]] = ..., event_metadata: _Optional[_Union[EventMetadata, _Mapping]] = ..., valid_until: _Optional[int] = ..., open_telemetry_carrier: _Optional[_Mapping[str, str]] = ...) -> None: ...

class DeviceMetadataSnapshotTaken(_message.Message):
    __slots__ = ("device_id", "device_metadata_updated", "update_pendings", "event_metadata")
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_METADATA_UPDATED_FIELD_NUMBER: _ClassVar[int]
    UPDATE_PENDINGS_FIELD_NUMBER: _ClassVar[int]
    EVENT_METADATA_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    device_metadata_updated: DeviceMetadataUpdated
    update_pendings: _containers.RepeatedCompositeFieldContainer[DeviceMetadataUpdatePending]
    event_metadata: EventMetadata
    def __init__(self, device_id: _Optional[str] = ..., device_metadata_updated: _Optional[_Union[DeviceMetadataUpdated, _Mapping]] = ..., update_pendings: _Optional[_Iterable[_Union[DeviceMetadataUpdatePending, _Mapping]]] = ..., event_metadata: _Optional[_Union[EventMetadata, _Mapping]] = ...) -> None: ...

class ServicesHeartbeat(_message.Message):
    __slots__ = ("valid", "expired")
    class Heartbeat(_message.Message):
        __slots__ = ("service_id", "valid_until")
        SERVICE_ID_FIELD_NUMBER: _ClassVar[int]
        VALID_UNTIL_FIELD_NUMBER: _ClassVar[int]
        service_id: str
        valid_until: int
        def __init__(self, service_id: _Optional[str] = ..., valid_until: _Optional[int] = ...) -> None: ...
    VALID_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_FIELD_NUMBER: _ClassVar[int]
    valid: _containers.RepeatedCompositeFieldContainer[ServicesHeartbeat.Heartbeat]
    expired: _containers.RepeatedCompositeFieldContainer[ServicesHeartbeat.Heartbeat]
    def __init__(self, valid: _Optional[_Iterable[_Union[ServicesHeartbeat.Heartbeat, _Mapping]]] = ..., expired: _Optional[_Iterable[_Union[ServicesHeartbeat.Heartbeat, _Mapping]]] = ...) -> None: ...

class ServiceMetadataUpdated(_message.Message):
    __slots__ = ("services_heartbeat", "event_metadata", "audit_context", "open_telemetry_carrier")
    class OpenTelemetryCarrierEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SERVICES_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    EVENT_METADATA_FIELD_NUMBER: _ClassVar[int]
    AUDIT_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    OPEN_TELEMETRY_CARRIER_FIELD_NUMBER: _ClassVar[int]
    services_heartbeat: ServicesHeartbeat
    event_metadata: EventMetadata
    audit_context: AuditContext
    open_telemetry_carrier: _containers.ScalarMap[str, str]
    def __init__(self, services_heartbeat: _Optional[_Union[ServicesHeartbeat, _Mapping]] = ..., event_metadata: _Optional[_Union[EventMetadata, _Mapping]] = ..., audit_context: _Optional[_Union[AuditContext, _Mapping]] = ..., open_telemetry_carrier: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ServiceMetadataSnapshotTaken(_message.Message):
    __slots__ = ("service_metadata_updated", "event_metadata")
    SERVICE_METADATA_UPDATED_FIELD_NUMBER: _ClassVar[int]
    EVENT_METADATA_FIELD_NUMBER: _ClassVar[int]
    service_metadata_updated: ServiceMetadataUpdated
    event_metadata: EventMetadata
    def __init__(self, service_metadata_updated: _Optional[_Union[ServiceMetadataUpdated, _Mapping]] = ..., event_metadata: _Optional[_Union[EventMetadata, _Mapping]] = ...) -> None: ...
