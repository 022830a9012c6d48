"""What every process serving the API puts in front of it: authentication, authorisation
and the epoch check (picklable, so stream workers build the same from it)."""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc

from svcproxy.frontend.admission.epoch import EpochInterceptor, new_epoch
from svcproxy.frontend.serving.access.auth import AuthConfig, Authenticator
from svcproxy.frontend.serving.access.authz import AuthInterceptor


@dataclass(frozen=True, slots=True)
class CallGuard:
    auth: AuthConfig = field(default_factory=AuthConfig)
    epoch: str = field(default_factory=new_epoch)

    def interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        """Outermost first: who is calling, then the epoch of a resume."""
        tokens = None
        if self.auth.tokens:
            from svcproxy.frontend.serving.access.tokenreview import TokenReviewer
            from svcproxy.frontend.sources.apiserver import load_api_client

            tokens = TokenReviewer(load_api_client(self.auth.token_kubeconfig),
                                   str(self.auth.token_audience), self.auth.token_cache_ttl,
                                   self.auth.node_service_accounts)
        authenticator = Authenticator(self.auth, tokens)
        return [AuthInterceptor(authenticator, self.auth.cluster_readers),
                EpochInterceptor(self.epoch)]
