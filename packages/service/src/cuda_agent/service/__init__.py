"""cuda_agent.service: the kernel environment over HTTP, for trainers outside Ray.

Endpoints (``/v1``): ``POST /evaluate`` (a Candidate record -> its EvalResult), ``POST
/workspaces`` (a Task record -> a workspace id), ``POST /workspaces/{id}/bash``, ``POST
/workspaces/{id}/evaluate``, ``DELETE /workspaces/{id}``, ``GET /health``. It runs the code it is
sent: loopback by default, a bearer token, bounded request size, time and concurrency
(``server`` module docstring). A trainer imports the client::

    from cuda_agent.service import ServiceClient
    result = ServiceClient("http://127.0.0.1:8470", token).evaluate(candidate)
"""

from .client import ServiceClient, ServiceError
from .messages import BashRequest, BashResult, ErrorResponse, Health, WorkspaceCreated
from .server import (
    TOKEN_ENV,
    KernelService,
    ServiceHTTPServer,
    ServiceSettings,
    TokenError,
    check_host,
    load_token,
)

__all__ = [
    "TOKEN_ENV",
    "BashRequest",
    "BashResult",
    "ErrorResponse",
    "Health",
    "KernelService",
    "ServiceClient",
    "ServiceError",
    "ServiceHTTPServer",
    "ServiceSettings",
    "TokenError",
    "WorkspaceCreated",
    "check_host",
    "load_token",
]
