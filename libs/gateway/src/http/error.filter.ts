import { Catch, Logger, type ArgumentsHost, type ExceptionFilter } from '@nestjs/common';
import type { Response } from 'express';
import { mapError } from './error-mapping.js';

/** Maps every error of an HTTP route to the contract's JSON error body. */
@Catch()
export class HttpErrorFilter implements ExceptionFilter {
  private readonly logger = new Logger('HttpError');

  catch(exception: unknown, host: ArgumentsHost): void {
    if (host.getType() !== 'http') return;
    const response = host.switchToHttp().getResponse<Response>();
    const { status, body, headers } = mapError(exception);
    if (status >= 500) this.logger.error(exception instanceof Error ? exception.stack : exception);
    if (response.headersSent) {
      response.end();
      return;
    }
    response.status(status).set(headers).json(body);
  }
}
