// The ConversationStore contract against the in-memory store of unit tests:
// the very cases the Postgres store passes (store.contract.ts), with no
// service behind them, so that a unit test on this double means what it
// would on the real store.
import { conversationStoreContract } from '../integration/store.contract.js';
import { InMemoryConversationStore } from './in-memory-conversation-store.js';

conversationStoreContract(InMemoryConversationStore.name, () => {
  const store = new InMemoryConversationStore();
  return Promise.resolve({
    store,
    countEvents: (conversationId) => Promise.resolve(store.allEvents(conversationId).length),
    leaseEpochs: (conversationId) => Promise.resolve(store.leaseEpochs(conversationId)),
    teardown: () => Promise.resolve(),
  });
});
