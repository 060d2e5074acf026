"""Re-exported for tests: the product's local SeaweedFS S3 server."""

from console.seaweed import S3Server, WeedMissing, start_s3, weed_binary

__all__ = ["S3Server", "WeedMissing", "start_s3", "weed_binary"]
