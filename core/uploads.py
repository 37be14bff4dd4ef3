"""A size limit on uploaded files, enforced while the request body streams in.

Django keeps small uploads in memory and streams larger ones to a temporary file, but sets no
limit on files (DATA_UPLOAD_MAX_MEMORY_SIZE covers form fields only). This handler runs first:
it counts each file's bytes as they arrive and, past MAX_UPLOAD_BYTES, drops the rest of that
file (`SkipFile`: the remaining bytes are read and discarded, never kept) and records why on the
request. `upload_refusal(request)` then gives the view one line to answer with (413).
"""

from __future__ import annotations

from django.conf import settings
from django.core.files.uploadhandler import FileUploadHandler, SkipFile


class SizeLimitUploadHandler(FileUploadHandler):
    def new_file(self, field_name, file_name, content_type, content_length, charset=None, content_type_extra=None):
        super().new_file(field_name, file_name, content_type, content_length, charset, content_type_extra)
        self.received = 0

    def receive_data_chunk(self, raw_data, start):
        self.received += len(raw_data)
        if self.received > settings.MAX_UPLOAD_BYTES:
            refusals = getattr(self.request, "upload_refusals", [])
            refusals.append((self.field_name, self.file_name))
            self.request.upload_refusals = refusals
            raise SkipFile()
        return raw_data  # the next handler (memory, then temporary file) stores it

    def file_complete(self, file_size):
        return None  # not ours to store


def upload_refusal(request) -> tuple[str, str] | None:
    """(field, one-line reason) if an uploaded file was over the limit, else None."""
    refusals = getattr(getattr(request, "_request", request), "upload_refusals", None)
    if not refusals:
        return None
    field, name = refusals[0]
    limit_mb = settings.MAX_UPLOAD_BYTES / (1 << 20)
    return field, f"{name} is larger than the upload limit of {limit_mb:g} MB (MAX_UPLOAD_MB)."
