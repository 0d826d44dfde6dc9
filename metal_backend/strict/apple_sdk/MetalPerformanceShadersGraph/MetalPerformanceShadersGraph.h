// Stand-in for Apple's <MetalPerformanceShadersGraph/MetalPerformanceShadersGraph.h> (see Foundation/Foundation.h here).
#pragma once

#import <MetalPerformanceShaders/MetalPerformanceShaders.h>

@interface MPSGraphTensor : NSObject
@end

@interface MPSGraph : NSObject
@end
