"""Message-queue providers for the common.messaging provider (``MessageQueueTrigger(scheme=...)``)."""
