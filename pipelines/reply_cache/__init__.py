"""The reply cache: answers said before play at once, from this process or a shared Redis.

- `config`: the ``cache:`` section;
- `key`: what a reply depends on, hashed into its key;
- `specifics`: turns that must not be answered from the cache;
- `entry`: a cached reply (text and audio per clause) and its FLAC wire format;
- `memory`, `redis_store`: the two backends;
- `cache`: `ReplyCache`, what a session uses.

See docs/cache.md.
"""
