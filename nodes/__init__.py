"""The Fabric storage node: request server, partition log on RocksDB, retention."""
