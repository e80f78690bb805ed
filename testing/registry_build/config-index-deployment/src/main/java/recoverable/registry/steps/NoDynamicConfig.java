package recoverable.registry.steps;

import java.util.List;

import apicurio.common.app.components.config.index.DynamicPropertiesInfoRecorder;
import io.apicurio.common.apps.config.DynamicConfigPropertyList;
import io.quarkus.arc.deployment.SyntheticBeanBuildItem;
import io.quarkus.deployment.annotations.BuildStep;
import io.quarkus.deployment.annotations.ExecutionTime;
import io.quarkus.deployment.annotations.Record;

/** The registry's dynamic configuration properties, as a bean: none (the test registry's settings are fixed). */
class NoDynamicConfig {

    @BuildStep
    @Record(ExecutionTime.RUNTIME_INIT)
    SyntheticBeanBuildItem properties(DynamicPropertiesInfoRecorder recorder) {
        return SyntheticBeanBuildItem.configure(DynamicConfigPropertyList.class)
                .runtimeValue(recorder.initializePropertiesInfo(List.of()))
                .unremovable()
                .setRuntimeInit()
                .done();
    }
}
