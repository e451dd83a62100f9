"""Island-model population: niches, parent selection, migration and resets (pure Python)."""
from islands.archipelago import Archipelago
from islands.config import IslandsConfig
from islands.population import Island, Member

__all__ = ["Archipelago", "Island", "IslandsConfig", "Member"]
