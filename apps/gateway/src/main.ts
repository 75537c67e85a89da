import 'reflect-metadata';
import { loadConfigOrExit } from '@cs/config';
import { StatusId } from '@cs/protocol';

const config = loadConfigOrExit('gateway');
console.log(config.role, StatusId.Ready);
