"""The rule catalogue."""

from traintop.rules.config import DEFAULT, Thresholds
from traintop.rules.engine import HOLDS, LAPSED, REVERSED, WEAK, Alert, Verdict, RuleContext, RulesEngine, Severity
from traintop.rules.cpu_training import TrainingOnCpu
from traintop.rules.fragmentation import Fragmentation
from traintop.rules.gpu_errors import GpuErrors
from traintop.rules.host_memory import HostMemoryPressure
from traintop.rules.idle_gpu import IdleWhileAlive
from traintop.rules.imbalance import Imbalance
from traintop.rules.low_clocks import ClocksBelowMax
from traintop.rules.memory_creep import MemoryCreep
from traintop.rules.oom import OutOfMemory
from traintop.rules.other_process import OtherProcess
from traintop.rules.pcie import PcieBottleneck
from traintop.rules.power_cap import PowerCapAtFullLoad
from traintop.rules.starvation import Starvation
from traintop.rules.stall import Stall
from traintop.rules.step_regression import StepTimeRegression
from traintop.rules.straggler import Straggler
from traintop.rules.thermal import ThermalThrottle
from traintop.rules.underuse import Underuse


# Bump when a rule's logic or default thresholds change: recordings made with another
# version get their rules re-run by `traintop analyze` instead of trusting their alerts.
RULES_VERSION = 8  # 8: findings hold now, explained findings, out of memory (2026-12-02)


def default_rules() -> list:
    # Order matters: starvation defers to a saturated PCIe link, underuse to starvation (and does not
    # advise a larger batch while memory creeps or fragments); the straggler to a stall; imbalance
    # to the straggler; fragmentation to out-of-memory.
    return [PcieBottleneck(), Stall(), Straggler(), Starvation(), ThermalThrottle(), PowerCapAtFullLoad(), MemoryCreep(),
            OutOfMemory(), Fragmentation(), Underuse(), TrainingOnCpu(), StepTimeRegression(), IdleWhileAlive(), OtherProcess(),
            HostMemoryPressure(), Imbalance(), ClocksBelowMax(), GpuErrors()]


def default_engine(config: Thresholds = DEFAULT) -> RulesEngine:
    return RulesEngine(rules=default_rules(), config=config)


__all__ = [
    "Alert", "DEFAULT", "HOLDS", "LAPSED", "REVERSED", "WEAK", "RULES_VERSION", "Verdict", "RuleContext", "RulesEngine", "Severity", "Thresholds",
    "default_engine", "default_rules",
]
