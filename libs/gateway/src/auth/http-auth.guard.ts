import {
  Injectable,
  createParamDecorator,
  type CanActivate,
  type ExecutionContext,
} from '@nestjs/common';
import type { Request } from 'express';
import type { Principal } from './principal.js';
import { TokenService, bearerToken } from './token.service.js';

type AuthenticatedRequest = Request & { principal?: Principal };

/** Authenticates REST calls with the bearer token of the Authorization header. */
@Injectable()
export class HttpAuthGuard implements CanActivate {
  constructor(private readonly tokens: TokenService) {}

  async canActivate(context: ExecutionContext): Promise<boolean> {
    const request = context.switchToHttp().getRequest<AuthenticatedRequest>();
    // Verified already before the body was read (see createHttpApp), else now.
    request.principal ??= await this.tokens.verify(bearerToken(request.headers.authorization));
    return true;
  }
}

/** Records the caller of a request verified before it reached the guard. */
export function authenticate(request: Request, principal: Principal): void {
  (request as AuthenticatedRequest).principal = principal;
}

/** The caller authenticated by `HttpAuthGuard`. */
export const CurrentPrincipal = createParamDecorator(
  (_data: unknown, context: ExecutionContext): Principal => {
    const principal = context.switchToHttp().getRequest<AuthenticatedRequest>().principal;
    if (!principal) throw new Error('HttpAuthGuard must run before CurrentPrincipal');
    return principal;
  },
);
